#include "comm/transport.h"

#include <ATen/ATen.h>
#include <c10/core/ScalarType.h>

#include "comm/c10d/transport.h"
#include "comm/local/transport.h"
#include "common/config.h"
#include "common/error.h"
#include "common/strings.h"
#if PIPETRAIN_HAVE_UCX
#include "comm/ucx/transport.h"
#endif

namespace pipetrain::comm {

std::string MessageId::describe() const {
  if (kind == Kind::Control)
    return label ? detail::concat(label, " (control message ", micro_batch, ")")
                 : detail::concat("control message ", micro_batch, " on channel ", chunk);
  if (label) return detail::concat(label, " (step ", step, ")");
  return detail::concat(kind == Kind::Activation ? "activation" : "gradient", " of micro-batch ",
                        micro_batch, chunk ? detail::concat(" chunk ", chunk) : "", " (step ", step, ")");
}

namespace {
WireDType to_wire(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat: return WireDType::Float32;
    case c10::kDouble: return WireDType::Float64;
    case c10::kHalf: return WireDType::Float16;
    case c10::kBFloat16: return WireDType::BFloat16;
    case c10::kLong: return WireDType::Int64;
    case c10::kInt: return WireDType::Int32;
    case c10::kShort: return WireDType::Int16;
    case c10::kChar: return WireDType::Int8;
    case c10::kByte: return WireDType::UInt8;
    case c10::kBool: return WireDType::Bool;
    default: throw Error(std::string("comm: dtype ") + c10::toString(t) + " cannot be sent");
  }
}

c10::ScalarType from_wire_dtype(WireDType t) {
  switch (t) {
    case WireDType::Float32: return c10::kFloat;
    case WireDType::Float64: return c10::kDouble;
    case WireDType::Float16: return c10::kHalf;
    case WireDType::BFloat16: return c10::kBFloat16;
    case WireDType::Int64: return c10::kLong;
    case WireDType::Int32: return c10::kInt;
    case WireDType::Int16: return c10::kShort;
    case WireDType::Int8: return c10::kChar;
    case WireDType::UInt8: return c10::kByte;
    case WireDType::Bool: return c10::kBool;
  }
  throw InternalError(detail::concat("comm: unchecked dtype code ", int(t)));
}
}  // namespace

WireHeader make_header(const at::Tensor& tensor, const MessageId& id) {
  if (tensor.dim() > kWireMaxDims)
    throw Error(detail::concat("comm: tensor of ", tensor.dim(), " dims; at most ", kWireMaxDims,
                               " can be sent"));
  WireHeader h;
  h.dtype = to_wire(tensor.scalar_type());
  h.dims = tensor.sizes().vec();
  h.nbytes = static_cast<uint64_t>(tensor.numel()) * tensor.element_size();
  h.micro_batch = id.micro_batch;
  h.step = id.step;
  h.tag = id.tag();
  return h;
}

void check_received(const WireHeader& h, const MessageId& id, int self, int src) {
  if (h.tag != id.tag() || h.micro_batch != id.micro_batch || h.step != id.step)
    throw TransportError(src, detail::concat("rank ", self, ": expected ", id.describe(),
                                             " from rank ", src, ", got micro-batch ",
                                             h.micro_batch, " of step ", h.step, " (tag ", h.tag, ")"));
}

c10::ScalarType scalar_type_of(WireDType dtype) { return from_wire_dtype(dtype); }

at::Tensor empty_for(const WireHeader& h) {
  return at::empty(h.dims, at::TensorOptions().dtype(from_wire_dtype(h.dtype)));
}

namespace {

// How each backend's endpoints are made, a row per backend in Backend's order (backend.h holds
// the rest of its row): an in-process group, and a process's endpoint where it takes its
// addresses from an exchange (the c10d backends meet in the store instead: process_group.h).
struct Maker {
  Backend backend;
  std::vector<std::unique_ptr<Transport>> (*group)(const TransportOptions&, int world_size);
  std::unique_ptr<Transport> (*process)(const TransportOptions&, int rank, int world_size, const AddressExchange&);
  std::string (*version)();
};

const std::vector<Maker>& makers() {
  static const std::vector<Maker> table = {
    {Backend::Local, [](const TransportOptions& o, int n) { return make_local_group(n, o); }, nullptr, nullptr},
#if PIPETRAIN_HAVE_UCX
    {Backend::Ucx, [](const TransportOptions& o, int n) { return make_ucx_group(n, o); },
     [](const TransportOptions& o, int rank, int n, const AddressExchange& x) { return make_ucx_transport(rank, n, x, o); },
     ucx_version},
#else
    {Backend::Ucx, nullptr, nullptr, nullptr},
#endif
    {Backend::Gloo, make_local_c10d_group, nullptr, nullptr},
    {Backend::NcclOrder, make_local_c10d_group, nullptr, nullptr},
    {Backend::Nccl, nullptr, nullptr, nullptr},  // one process per GPU, joined in the store
  };
  return table;
}

const Maker& maker(Backend backend) {
  const BackendInfo& b = info(backend);  // the row exists
  const Maker& m = makers().at(static_cast<size_t>(backend));
  PIPETRAIN_CHECK(m.backend == backend, "comm: the makers' row of ", b.name, " is out of place");
  return m;
}

// The compiled backends whose ranks may be processes, for messages.
std::string process_backends() {
  std::vector<std::string> names;
  for (const BackendInfo& b : backend_table())
    if (b.compiled && b.processes) names.emplace_back(b.name);
  return join(names, ", ");
}

}  // namespace

std::vector<std::string> transport_backends() {
  std::vector<std::string> names;
  for (const BackendInfo& b : backend_table())
    if (b.compiled) names.emplace_back(b.name);
  return names;
}

std::string transport_backend_version(Backend backend) {
  const Maker& m = maker(backend);
  return info(backend).compiled && m.version ? m.version() : "";
}

bool has_transport_backend(const std::string& name) {
  const auto b = find_backend(name);
  return b && info(*b).compiled;
}

std::vector<std::unique_ptr<Transport>> make_transport_group(const TransportOptions& options, int world_size) {
  const BackendInfo& b = info(options.backend);
  check_compiled(options.backend, "comm");
  if (!b.threads)
    throw ConfigError(std::string("comm: transport \"") + b.name +
                      "\" joins one process per GPU, not the threads of one process (runtime.kind processes)");
  return maker(options.backend).group(options, world_size);
}

std::unique_ptr<Transport> make_process_transport(const TransportOptions& options, int rank, int world_size,
                                                  const AddressExchange& exchange) {
  const BackendInfo& b = info(options.backend);
  check_compiled(options.backend, "comm");
  if (b.c10d)
    throw ConfigError(std::string("comm: transport \"") + b.name +
                      "\" meets in the rendezvous store: make it with make_group_transport (process_group.h)");
  const Maker& m = maker(options.backend);
  if (!b.processes || !m.process)
    throw ConfigError(std::string("comm: transport \"") + b.name + "\" connects the threads of one process, not processes; this build connects them over " +
                      process_backends());
  return m.process(options, rank, world_size, exchange);
}

}  // namespace pipetrain::comm
