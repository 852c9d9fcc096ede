#include "comm/transport.h"

#include <c10/core/ScalarType.h>

#include "common/error.h"

namespace pipetrain::comm {

std::string MessageId::describe() const {
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

}  // namespace pipetrain::comm
