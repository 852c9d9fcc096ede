// Pipeline (pipeline.h): tied parameters. Each member of a tie keeps its own tensor on the stage
// that runs its layer; once every stage has finished its list (and the gradients are reduced
// across data-parallel copies), the members' gradients are summed in member order and every
// member takes the sum, so each member's optimizer makes the same update: one weight's update,
// as one device holding one shared tensor makes it. Across ranks the sum goes through the
// control plane, in the same order on every rank.
#include <torch/torch.h>

#include "common/error.h"
#include "common/strings.h"
#include "models/model.h"
#include "pipeline/executor.h"

namespace pipetrain::pipeline {

void Ties::init(const torch::nn::Sequential& model, const std::vector<models::Tie>& ties,
                const partitioner::Balance& balance) {
  if (ties.empty()) return;
  const auto names = models::layer_names(model);
  const auto off = partitioner::offsets(balance);
  const int layers = static_cast<int>(model->size());
  torch::NoGradGuard no_grad;
  for (size_t g = 0; g < ties.size(); ++g) {
    const models::Tie& tie = ties[g];
    const std::string where = detail::concat("pipeline: tie ", g);
    if (tie.size() < 2) throw ConfigError(where + ": a tie needs at least two parameters");
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
    groups_.push_back(std::move(members));
  }
}

// The members may live on different devices (stages on several GPUs, or a GPU and the CPU): the
// sum is made on one device, the first member's in-process and the host across ranks (where the
// control plane carries host tensors), and each member takes a copy on its own device. Elementwise
// addition rounds alike on every device, so where it is made does not change the sum.
void Ties::sum_grads(const std::function<bool(int)>& runs, comm::Collectives* group,
                     const std::function<int(int)>& rank_of) const {
  torch::NoGradGuard no_grad;
  for (const auto& members : groups_) {
    std::vector<at::Tensor> grads;
    for (const Member& t : members) {
      at::Tensor g;
      if (runs(t.vs)) g = t.param.grad().defined() ? t.param.grad() : torch::zeros_like(t.param);
      if (group) {  // every rank sends what it has (nothing for another rank's member)
        const auto all = group->all_gather(g.defined() ? g.reshape({-1}).cpu() : at::empty({0}, t.param.options().device(at::kCPU)),
                                          "a tied parameter's gradients");
        g = all.at(rank_of(t.vs));
        if (g.numel() != t.param.numel() && runs(t.vs))
          throw Error("pipeline: a tied parameter's gradient arrived with the wrong size");
      }
      grads.push_back(g);
    }
    at::Tensor sum = grads[0].clone();
    for (size_t i = 1; i < grads.size(); ++i) sum.add_(grads[i].to(sum.device()).reshape(sum.sizes()));
    for (const Member& t : members)
      if (runs(t.vs)) t.param.mutable_grad() = sum.reshape(t.param.sizes()).to(t.param.device(), /*non_blocking=*/false, /*copy=*/true);
  }
}

}  // namespace pipetrain::pipeline
