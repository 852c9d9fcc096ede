// Pipeline (pipeline.h): tied parameters. Each member of a tie keeps its own tensor on the stage
// that runs its layer; once every stage has finished its list (and the gradients are reduced
// across data-parallel copies), the members' gradients are summed in member order and every
// member takes the sum, so each member's optimizer makes the same update: one weight's update,
// as one device holding one shared tensor makes it. Across ranks the members' ranks alone take
// part: the gradients go to the first member's rank over the pipeline's transport (device to
// device where it takes a GPU's tensors) and the sum comes back.
#include <algorithm>

#include <torch/torch.h>

#include "common/error.h"
#include "common/strings.h"
#include "models/model.h"
#include "pipeline/executor.h"

namespace pipetrain::pipeline {

namespace {
at::Tensor grad_or_zeros(const at::Tensor& param) { return param.grad().defined() ? param.grad() : torch::zeros_like(param); }

// Each member takes the sum as a tensor of its own on its own device (an optimizer that changes a
// gradient in place, as clipping does, must not change another member's).
void give(const at::Tensor& param, const at::Tensor& sum) {
  param.mutable_grad() = sum.reshape(param.sizes()).to(param.device(), /*non_blocking=*/false, /*copy=*/true);
}

// The ties' messages travel on a channel of their own, above every stage boundary's (messages.cpp:
// the chunk plus the part times 256, parts up to 62) and within every transport's (UCX's tags
// hold 14 bits): part 63. The place is the tie and the member, the sum's member kSum.
// kValue: the first member's value after the optimizer step (share_values).
constexpr int kTiesChannel = 63 << 8;
constexpr int kSum = 0xffff, kValue = 0xfffe;
comm::MessageId tie_message(size_t tie, size_t member, int64_t step) {
  return {comm::Kind::Grad, static_cast<int>((tie << 16) | member), kTiesChannel, step,
          member == kSum     ? "a tied parameter's summed gradient"
          : member == kValue ? "a tied parameter's value after the step"
                             : "a tied parameter's gradient"};
}

// A tie's message from rank `src`, checked against the parameter it is for, on this device.
at::Tensor receive_like(comm::Transport& endpoint, stages::DeviceContext& context, int src, const comm::MessageId& id,
                        const at::Tensor& like, double timeout_s) {
  const at::Tensor t = endpoint.recv(src, id, Deadline::after(timeout_s));
  if (t.numel() != like.numel() || t.scalar_type() != like.scalar_type())
    throw Error(detail::concat("pipeline: rank ", endpoint.rank(), ": ", id.describe(), " from rank ", src, " has ",
                               t.numel(), " ", c10::toString(t.scalar_type()), " elements where the parameter has ",
                               like.numel(), " ", c10::toString(like.scalar_type())));
  stages::Received got = context.receive(t, stages::Marker{});
  context.wait(got.ready);
  return got.tensor;
}

// From the tie's first member's rank (`ranks`: each member's, the first's first) to each other
// member's rank once, in the order they first appear.
void send_to_others(comm::Transport& endpoint, stages::DeviceContext& context, const std::vector<int>& ranks,
                    const comm::MessageId& id, const at::Tensor& t) {
  std::vector<int> sent{ranks.front()};
  for (int r : ranks)
    if (std::find(sent.begin(), sent.end(), r) == sent.end()) {
      endpoint.send(r, id, endpoint.takes(t.device()) ? t : context.to_host(t));
      sent.push_back(r);
    }
}
}  // namespace

void Ties::init(const torch::nn::Sequential& model, const std::vector<models::Tie>& ties,
                const partitioner::Balance& balance) {
  if (ties.empty()) return;
  if (ties.size() > 0x7fff) throw ConfigError(detail::concat("pipeline: ", ties.size(), " ties; at most 32767"));
  const auto names = models::layer_names(model);
  const auto off = partitioner::offsets(balance);
  const int layers = static_cast<int>(model->size());
  torch::NoGradGuard no_grad;
  for (size_t g = 0; g < ties.size(); ++g) {
    const models::Tie& tie = ties[g];
    const std::string where = detail::concat("pipeline: tie ", g);
    if (tie.size() < 2) throw ConfigError(where + ": a tie needs at least two parameters");
    if (tie.size() >= kValue)
      throw ConfigError(detail::concat(where, ": ", tie.size(), " parameters; at most ", kValue - 1));
    std::vector<Member> members;
    for (const models::ParamRef& ref : tie) {
      if (ref.layer < 0 || ref.layer >= layers)
        throw ConfigError(detail::concat(where, ": layer ", ref.layer, " outside the model's ", layers, " layers"));
      auto params = model->ptr(ref.layer)->named_parameters();
      const at::Tensor* p = params.find(ref.name);
      if (!p)
        throw ConfigError(detail::concat(where, ": layer ", ref.layer, " (", names[ref.layer], ") has no parameter '",
                                         ref.name, "'"));
      int vs = 0;
      while (off[vs + 1] <= ref.layer) ++vs;
      if (!members.empty()) {
        const at::Tensor& first = members.front().param;
        if (p->sizes() != first.sizes() || p->scalar_type() != first.scalar_type())
          throw ConfigError(detail::concat(where, ": ", names[ref.layer], ".", ref.name, " is ", c10::toString(p->scalar_type()),
                                           " ", p->sizes(), ", ", names[tie[0].layer], ".", tie[0].name, " ",
                                           c10::toString(first.scalar_type()), " ", first.sizes()));
        if (p->unsafeGetTensorImpl() == first.unsafeGetTensorImpl())
          throw ConfigError(detail::concat(where, ": ", names[ref.layer], ".", ref.name,
                                           " is the same tensor as the tie's first member; each member keeps its own"));
        p->copy_(first);  // equal from the start
        followers_.insert(p->unsafeGetTensorImpl());
        names_.emplace_back(names[ref.layer] + "." + ref.name, names[tie[0].layer] + "." + tie[0].name);
      }
      members.push_back({vs, *p});
    }
    // A frozen tie (LoRA's embedding and head) has no gradient to sum; a tie half frozen would
    // train one use of one weight.
    const bool trains = members.front().param.requires_grad();
    for (const Member& m : members)
      if (m.param.requires_grad() != trains)
        throw ConfigError(detail::concat(where, ": ", names[tie[0].layer], ".", tie[0].name, " is ", trains ? "trained" : "frozen",
                                         " and another member is not; a tie's members train together or not at all"));
    if (trains) groups_.push_back(std::move(members));
  }
}

// The members may live on different devices (stages on several GPUs, or a GPU and the CPU): the
// sum is made on the first member's device and each member takes a copy on its own. Elementwise
// addition rounds alike on every device, so where it is made does not change the sum.
void Ties::sum_grads() const {
  torch::NoGradGuard no_grad;
  for (const auto& members : groups_) {
    at::Tensor sum = grad_or_zeros(members[0].param).clone();
    for (size_t i = 1; i < members.size(); ++i) sum.add_(grad_or_zeros(members[i].param).to(sum.device()));
    for (const Member& t : members) give(t.param, sum);
  }
}

// Every rank walks the ties in the same order and, within a tie, the same sequence of messages:
// the members' gradients to the first member's rank in member order, then the sum to each other
// member's rank in the order they first appear. Each message has both its ranks waiting for it
// in that one order, so a transport whose sends complete only at the matching receive (NCCL's)
// cannot deadlock on it.
void Ties::exchange_grads(comm::Transport& endpoint, stages::DeviceContext& context,
                          const std::function<int(int)>& rank_of, int64_t step, double timeout_s) const {
  torch::NoGradGuard no_grad;
  const int me = endpoint.rank();
  auto send = [&](int dst, const comm::MessageId& id, const at::Tensor& t) {
    endpoint.send(dst, id, endpoint.takes(t.device()) ? t : context.to_host(t));
  };
  auto recv = [&](int src, const comm::MessageId& id, const at::Tensor& like) {
    return receive_like(endpoint, context, src, id, like, timeout_s);
  };
  for (size_t g = 0; g < groups_.size(); ++g) {
    const auto& members = groups_[g];
    std::vector<int> ranks;
    for (const Member& t : members) ranks.push_back(rank_of(t.vs));
    const auto mine = std::find(ranks.begin(), ranks.end(), me);
    if (mine == ranks.end()) continue;
    const at::Tensor& like = members[mine - ranks.begin()].param;  // a member that runs here
    const int owner = ranks[0];
    at::Tensor sum;
    if (me == owner) {
      for (size_t i = 0; i < members.size(); ++i) {
        const at::Tensor part = ranks[i] == me ? grad_or_zeros(members[i].param) : recv(ranks[i], tie_message(g, i, step), like);
        if (i == 0)
          sum = part.clone();
        else
          sum.add_(part.reshape(sum.sizes()).to(sum.device()));
      }
      send_to_others(endpoint, context, ranks, tie_message(g, kSum, step), sum);
    } else {
      for (size_t i = 0; i < members.size(); ++i)
        if (ranks[i] == me) send(owner, tie_message(g, i, step), grad_or_zeros(members[i].param));
      sum = recv(owner, tie_message(g, kSum, step), like);
    }
    for (size_t i = 0; i < members.size(); ++i)
      if (ranks[i] == me) give(members[i].param, sum);
  }
}

std::vector<int> Ties::virtual_stages() const {
  std::vector<int> out;
  for (const auto& members : groups_)
    for (const Member& t : members)
      if (std::find(out.begin(), out.end(), t.vs) == out.end()) out.push_back(t.vs);
  return out;
}

void Ties::copy_values() const {
  torch::NoGradGuard no_grad;
  for (const auto& members : groups_)
    for (size_t i = 1; i < members.size(); ++i) members[i].param.copy_(members[0].param);
}

// The first member's rank sends its value to each other member's rank once, in the order they
// first appear; every rank walks the ties in the same order (as exchange_grads).
void Ties::exchange_values(comm::Transport& endpoint, stages::DeviceContext& context,
                           const std::function<int(int)>& rank_of, int64_t step, double timeout_s) const {
  torch::NoGradGuard no_grad;
  const int me = endpoint.rank();
  for (size_t g = 0; g < groups_.size(); ++g) {
    const auto& members = groups_[g];
    std::vector<int> ranks;
    for (const Member& t : members) ranks.push_back(rank_of(t.vs));
    const auto mine = std::find(ranks.begin(), ranks.end(), me);
    if (mine == ranks.end()) continue;
    const comm::MessageId id = tie_message(g, kValue, step);
    at::Tensor value;
    if (me == ranks[0]) {
      value = members[0].param.detach().clone();  // the next step changes the parameter in place
      send_to_others(endpoint, context, ranks, id, value);
    } else {
      value = receive_like(endpoint, context, ranks[0], id, members[mine - ranks.begin()].param, timeout_s);
    }
    for (size_t i = 1; i < members.size(); ++i)
      if (ranks[i] == me) members[i].param.copy_(value.reshape(members[i].param.sizes()));
  }
}

}  // namespace pipetrain::pipeline
