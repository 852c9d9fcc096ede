#include "comm/backend.h"

#include "common/config.h"
#include "common/error.h"
#include "common/strings.h"

namespace pipetrain::comm {

const std::vector<BackendInfo>& backend_table() {
  // clang-format off
  static const std::vector<BackendInfo> table = {
    {Backend::Local, "local", "threads of one process sharing mailboxes", "",
     true, true, false, false, false},
    {Backend::Ucx, "ucx", "UCX's tagged messages, between threads or processes", "UCX at configure time",
     PIPETRAIN_HAVE_UCX != 0, true, true, false, false},
    {Backend::Gloo, "gloo", "c10d's Gloo group (CPU tensors)", "",
     true, true, true, true, false},
    {Backend::NcclOrder, "nccl-order", "NCCL's ordering rules on the CPU, threads of one process (tests)", "",
     true, true, false, false, false},
    {Backend::Nccl, "nccl", "c10d's NCCL group between GPUs, one process each", "a libtorch with CUDA and NCCL at configure time",
     PIPETRAIN_HAVE_NCCL != 0, false, true, true, true},
  };
  // clang-format on
  return table;
}

const BackendInfo& info(Backend backend) {
  const auto& table = backend_table();
  const auto i = static_cast<size_t>(backend);
  if (i >= table.size() || table[i].backend != backend)
    throw InternalError(detail::concat("comm: no row for backend ", static_cast<int>(backend)));
  return table[i];
}

const char* name(Backend backend) { return info(backend).name; }

std::optional<Backend> find_backend(const std::string& name) {
  for (const BackendInfo& b : backend_table())
    if (name == b.name) return b.backend;
  return std::nullopt;
}

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const BackendInfo& b : backend_table()) names.emplace_back(b.name);
  return names;
}

Backend parse_backend(const std::string& name, const std::string& where) {
  if (auto b = find_backend(name)) return *b;
  throw ConfigError(where + ": unknown transport \"" + printable(name, 60) + "\"; choose one of: " + join(backend_names(), ", "));
}

void check_compiled(Backend backend, const std::string& where) {
  const BackendInfo& b = info(backend);
  if (!b.compiled)
    throw ConfigError(where + ": transport \"" + b.name + "\" is not compiled into this build (needs " + b.needs + ")");
}

}  // namespace pipetrain::comm
