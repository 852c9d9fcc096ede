#include "comm/transport.h"

#include <ATen/ATen.h>
#include <c10/core/ScalarType.h>

#include "comm/c10d/transport.h"
#include "comm/local/transport.h"
#include "common/config.h"
#include "common/error.h"
#if PIPETRAIN_HAVE_UCX
#include "comm/ucx/transport.h"
#endif

namespace pipetrain::comm {

std::string MessageId::describe() const {
  if (kind == Kind::Control)
    return label ? detail::concat(label, " (control message ", micro_batch, ")")
                 : detail::concat("control message ", micro_batch, " on channel ", chunk);
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

std::vector<std::string> transport_backends() {
  std::vector<std::string> names{"local"};
#if PIPETRAIN_HAVE_UCX
  names.push_back("ucx");
#endif
  names.push_back("gloo");  // libtorch's own Gloo, in every PyTorch build
  names.push_back("nccl-order");  // NCCL's ordering rules on the CPU (tests)
#if PIPETRAIN_HAVE_NCCL
  names.push_back("nccl");
#endif
  return names;
}

std::string transport_backend_version(const std::string& name) {
#if PIPETRAIN_HAVE_UCX
  if (name == "ucx") return ucx_version();
#endif
  return "";
}

namespace {
std::string backend_list() {
  std::string known;
  for (const auto& n : transport_backends()) known += (known.empty() ? "" : ", ") + n;
  return known;
}
}  // namespace

bool has_transport_backend(const std::string& name) {
  for (const auto& n : transport_backends())
    if (n == name) return true;
  return false;
}

std::vector<std::unique_ptr<Transport>> make_transport_group(const TransportOptions& options, int world_size) {
  if (options.backend == "local") return make_local_group(world_size, options);
  if (options.backend == "gloo" || options.backend == "nccl-order" ||
      (options.backend == "nccl" && has_transport_backend("nccl")))
    return make_local_c10d_group(options, world_size);
#if PIPETRAIN_HAVE_UCX
  if (options.backend == "ucx") return make_ucx_group(world_size, options);
#else
  if (options.backend == "ucx")
    throw ConfigError("comm: transport \"ucx\" is not compiled into this build "
                      "(configure with UCX installed, or -DPIPETRAIN_WITH_UCX=ON to require it)");
#endif
  throw ConfigError("comm: unknown transport \"" + options.backend + "\" (this build has: " + backend_list() + ")");
}

std::unique_ptr<Transport> make_process_transport(const TransportOptions& options, int rank, int world_size,
                                                  const AddressExchange& exchange) {
#if PIPETRAIN_HAVE_UCX
  if (options.backend == "ucx") return make_ucx_transport(rank, world_size, exchange, options);
#endif
  if (options.backend == "local")
    throw ConfigError("comm: transport \"local\" connects the threads of one process, not processes; use \"ucx\"");
  if (options.backend == "gloo" || options.backend == "nccl" || options.backend == "nccl-order")
    throw ConfigError("comm: transport \"" + options.backend +
                      "\" meets in the rendezvous store: make it with make_group_transport (process_group.h)");
  throw ConfigError("comm: transport \"" + options.backend + "\" cannot connect processes in this build (it has: " +
                    backend_list() + ")");
}

}  // namespace pipetrain::comm
