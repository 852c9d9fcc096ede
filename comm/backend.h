// comm: the one table of transport backends. What a backend is called, whether this build has
// it, what it needs, which worlds it joins (threads of one process, processes) and what it
// carries is answered by its row here; no caller compares backend names. A backend is parsed
// from its name once, where a config or a flag is read; comm/transport.cpp makes its endpoints.
// Nothing here includes libtorch.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace pipetrain::comm {

/// The transport backends, in the order the table (and every listing) shows them.
enum class Backend {
  Local,      ///< local: threads of one process sharing mailboxes
  Ucx,        ///< ucx: UCX's tagged messages (when compiled in)
  Gloo,       ///< gloo: c10d's Gloo group (CPU tensors), libtorch's own
  NcclOrder,  ///< nccl-order: the c10d transport with NCCL's ordering rules, on the CPU (tests)
  Nccl,       ///< nccl: c10d's NCCL group between GPUs, one per process (when compiled in)
};

/// One row of the table.
struct BackendInfo {
  Backend backend;    ///< the row's backend
  const char* name;   ///< as configs, flags and messages spell it
  const char* help;   ///< what it is, in a few words
  const char* needs;  ///< what a build needs to have it ("" for the ones every build has)
  bool compiled;      ///< whether this build has it
  bool threads;       ///< its ranks may be threads of one process (make_transport_group)
  bool processes;     ///< its ranks may be processes (runtime.kind processes)
  bool c10d;          ///< meets in the rendezvous store as a c10d group (make_group_transport)
  bool gpu_only;      ///< carries tensors between GPUs only
};

/// Every backend, in Backend's order.
const std::vector<BackendInfo>& backend_table();
/// The row of `backend`.
const BackendInfo& info(Backend backend);
/// The backend's name ("ucx").
const char* name(Backend backend);
/// The backend named `name`, compiled in or not, if there is one.
std::optional<Backend> find_backend(const std::string& name);
/// Every backend's name, compiled in or not, in the table's order.
std::vector<std::string> backend_names();
/// The backend named `name`; ConfigError naming `where` and the known names otherwise.
Backend parse_backend(const std::string& name, const std::string& where = "transport");
/// ConfigError naming `where` when this build lacks `backend`, saying what it needs.
void check_compiled(Backend backend, const std::string& where);

}  // namespace pipetrain::comm
