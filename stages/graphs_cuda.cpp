// CUDA graphs per stage (graphs.h), in a build with CUDA.
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <map>
#include <mutex>

#include "common/error.h"
#include "common/strings.h"
#include "stages/graphs.h"

namespace pipetrain::stages {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One micro-batch index's graphs and the static tensors they read and write.
struct Slot {
  at::cuda::CUDAGraph forward, backward;
  at::Tensor input, target, weight;  // copied in before the forward's replay
  at::Tensor output;                 // the forward's result (detached)
  at::Tensor grad_output;            // copied in before the backward's replay
  std::vector<bool> wants;           // per input of the function (the stage's input, then each parameter)
  variable_list grads;               // the backward's results, in the order of `wants` (undefined where not wanted)
};

// Captures are taken one at a time in the process: capture_begin and a graph's destruction
// register and unregister it with the CUDA generators' shared state, which libtorch does not
// lock. Nothing that runs on autograd's device threads takes it (a replay does not), so a
// backward captured under it cannot wait on a holder.
std::mutex& capture_mutex() {
  static std::mutex m;
  return m;
}

// .grad of each parameter set aside while the backward is captured: a layer that adds its weight
// gradient into .grad itself (models/linear.cpp) would capture a write to this step's .grad,
// which later steps free, instead of returning the gradient to the graph.
class GradsAside {
 public:
  explicit GradsAside(const std::vector<at::Tensor>& params) : params_(params) {
    for (const at::Tensor& p : params_) {
      held_.push_back(p.grad());
      p.mutable_grad() = at::Tensor();
    }
  }
  ~GradsAside() {
    for (size_t i = 0; i < params_.size(); ++i) params_[i].mutable_grad() = held_[i];
  }
  GradsAside(const GradsAside&) = delete;
  GradsAside& operator=(const GradsAside&) = delete;

 private:
  const std::vector<at::Tensor>& params_;
  std::vector<at::Tensor> held_;
};

bool same_layout(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  return !a.defined() || (a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() && a.device() == b.device());
}

// The graphed forward as an autograd function: its backward replays the slot's backward graph.
// Its inputs are the stage's input and its parameters, so that autograd routes their gradients.
struct Replay : public torch::autograd::Function<Replay> {
  static at::Tensor forward(AutogradContext* ctx, int64_t slot_address, at::TensorList inputs) {
    auto* slot = reinterpret_cast<Slot*>(slot_address);
    ctx->saved_data["slot"] = slot_address;
    (void)inputs;  // copied in by the caller before apply(): the graph reads the static copies
    slot->forward.replay();
    return slot->output.detach();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto* slot = reinterpret_cast<Slot*>(ctx->saved_data["slot"].toInt());
    slot->grad_output.copy_(grad_outputs.at(0), /*non_blocking=*/true);
    slot->backward.replay();
    variable_list out{at::Tensor()};  // the slot's address has no gradient
    // The static results themselves: the slot keeps them, so autograd adds them into .grad
    // (or copies them) rather than taking them over; the next replay may then rewrite them.
    for (const at::Tensor& g : slot->grads) out.push_back(g);
    return out;
  }
};

class CudaStageGraphs : public StageGraphs {
 public:
  explicit CudaStageGraphs(const c10::Device& device) : device_(device) {}
  ~CudaStageGraphs() override {
    std::lock_guard<std::mutex> lock(capture_mutex());
    slots_.clear();
  }

  at::Tensor forward(int m, const at::Tensor& input, const at::Tensor& target, double weight,
                     at::ScalarType weight_dtype, const std::vector<at::Tensor>& params,
                     const GraphBody& body) override {
    auto it = slots_.find(m);
    if (it == slots_.end()) {
      capture(m, input, target, weight_dtype, params, body);
      it = slots_.find(m);
    } else if (!same_layout(it->second->input, input) || !same_layout(it->second->target, target) ||
               it->second->wants.at(0) != input.requires_grad()) {
      return {};  // another shape than captured: eagerly
    }
    Slot& slot = *it->second;
    slot.input.detach().copy_(input.detach(), /*non_blocking=*/true);
    if (target.defined()) slot.target.copy_(target, /*non_blocking=*/true);
    slot.weight.fill_(weight);
    std::vector<at::Tensor> inputs{input};
    inputs.insert(inputs.end(), params.begin(), params.end());
    return Replay::apply(reinterpret_cast<int64_t>(&slot), at::TensorList(inputs));
  }

 private:
  void capture(int m, const at::Tensor& input, const at::Tensor& target, at::ScalarType weight_dtype,
               const std::vector<at::Tensor>& params, const GraphBody& body) {
    std::lock_guard<std::mutex> lock(capture_mutex());
    auto slot = std::make_unique<Slot>();
    slot->input = input.detach().clone();
    if (input.requires_grad()) slot->input.requires_grad_(true);
    if (target.defined()) slot->target = target.detach().clone();
    slot->weight = at::ones({}, at::TensorOptions().dtype(weight_dtype).device(device_));
    const auto pool = at::cuda::graph_pool_handle();
    // Every cast of a weight is captured with the forward that uses it: autocast's cache would
    // hand one graph's cast to the next.
    const bool cache = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(false);
    struct Restore {
      bool on;
      ~Restore() { at::autocast::set_autocast_cache_enabled(on); }
    } restore{cache};
    at::Tensor out;
    {
      torch::AutoGradMode grad(true);
      // Thread-local capture: the other stages' threads go on issuing their work meanwhile.
      slot->forward.capture_begin(pool, cudaStreamCaptureModeThreadLocal);
      try {
        out = body(slot->input, slot->target, slot->weight);
      } catch (...) {
        end_failed(slot->forward, pool);
        throw;
      }
      slot->forward.capture_end();
    }
    PIPETRAIN_CHECK(out.requires_grad(), "a graphed forward whose output needs no gradient (micro-batch ", m, ")");
    variable_list wrt;
    slot->wants.push_back(slot->input.requires_grad());
    if (slot->input.requires_grad()) wrt.push_back(slot->input);
    for (const at::Tensor& p : params) {
      slot->wants.push_back(p.requires_grad());
      if (p.requires_grad()) wrt.push_back(p);
    }
    slot->grad_output = at::zeros_like(out);
    variable_list grads;
    GradsAside aside(params);
    slot->backward.capture_begin(pool, cudaStreamCaptureModeThreadLocal);
    try {
      grads = torch::autograd::grad({out}, wrt, {slot->grad_output}, /*retain_graph=*/false, /*create_graph=*/false,
                                    /*allow_unused=*/true);
    } catch (...) {
      end_failed(slot->backward, pool);
      throw;
    }
    slot->backward.capture_end();
    size_t next = 0;
    for (bool w : slot->wants) slot->grads.push_back(w ? grads.at(next++) : at::Tensor());
    slot->output = out.detach();
    slots_.emplace(m, std::move(slot));
  }

  // A capture that threw: ended, so that the stream and the allocator leave capture mode; the
  // first error is the one reported. Where the capture itself was invalidated, capture_end
  // throws before it hands the allocator back: that is done here, and the pool's share released
  // (the graph, never instantiated, releases nothing).
  void end_failed(at::cuda::CUDAGraph& graph, at::cuda::MempoolId_t pool) {
    try {
      graph.capture_end();
    } catch (...) {
      c10::cuda::CUDACachingAllocator::endAllocateToPool(device_.index(), pool);
      c10::cuda::CUDACachingAllocator::releasePool(device_.index(), pool);
      (void)cudaGetLastError();  // the capture's error is not the next call's
    }
  }

  c10::Device device_;
  std::map<int, std::unique_ptr<Slot>> slots_;
};

}  // namespace

std::unique_ptr<StageGraphs> make_stage_graphs(const c10::Device& device) {
  if (!device.is_cuda()) return nullptr;
  return std::make_unique<CudaStageGraphs>(device);
}

}  // namespace pipetrain::stages
