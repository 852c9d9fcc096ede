// Internal to the pipeline module: one device's run of its action list (a training step's or an
// evaluation's), for the executor (executor.h). The runner owns what lives only while the list
// runs on that device: its per-micro-batch buffers (inputs received and their markers, results
// waiting for their send, output gradients), the hand-over between the device's own chunks, its
// spans and peaks, the deferred weight gradients and the reductions it started. Each action kind
// is one method, found through a table by the action's op; run() is the list, begin and end.
#pragma once

#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "pipeline/executor.h"

namespace pipetrain::pipeline {

class DeviceRunner {
 public:
  DeviceRunner(Executor& e, int device, const schedule::Schedule& lists, Pass pass, int64_t tag_step,
               Clock::time_point t0);
  // Runs the device's whole list: the stages' step begins, every action in order (each through
  // its handler), then the deferred weight gradients, the losses read once, the device's stamps
  // resolved and the reductions waited for.
  void run();

 private:
  using Key = std::pair<int, int>;  // (micro-batch, chunk)
  using Handler = void (DeviceRunner::*)(const schedule::Action&, int vs, const Key&);

  static Handler handler(schedule::Op op);  // the table
  void begin();
  void finish();

  // The actions (one per schedule::Op).
  void recv_activation(const schedule::Action& a, int vs, const Key& key);
  void forward(const schedule::Action& a, int vs, const Key& key);
  void send_activation(const schedule::Action& a, int vs, const Key& key);
  void recv_grad(const schedule::Action& a, int vs, const Key& key);
  void backward(const schedule::Action& a, int vs, const Key& key);  // fused, or B of a split backward
  void backward_weight(const schedule::Action& a, int vs, const Key& key);
  void send_grad(const schedule::Action& a, int vs, const Key& key);
  void reduce(const schedule::Action& a, int vs, const Key& key);

  void wait_all(std::map<Key, std::vector<stages::Marker>>& ready, const Key& key);
  at::Tensor bring(const at::Tensor& t);  // a batch's tensor from the host (or the caller's device)
  void flush_weight_grads();
  void trace_action(const schedule::Action& a, int vs, double start, const stages::Stamp& began);

  Executor& e_;
  const int r_;
  const schedule::Schedule& lists_;
  const bool training_;
  const int64_t tag_step_;
  const Clock::time_point t0_;
  stages::DeviceContext& ctx_;
  std::vector<stages::Stage*> mine_;  // this device's virtual stages, by chunk

  // received: inputs and output gradients waiting for their compute; outbox: results
  // (activations, input gradients) waiting for their send action.
  std::map<Key, at::Tensor> received_, outbox_, grads_;
  std::map<Key, stages::Skips> received_skips_, outbox_skips_, grad_skips_;  // the skips crossing with each
  std::map<Key, std::vector<stages::Marker>> received_ready_, grad_ready_;  // waited for before use
  LocalHandoff local_;  // between this device's own virtual stages

  // An evaluation leaves the training step's trace as it was.
  std::vector<Span> evaluation_spans_;
  int evaluation_peaks_[2] = {0, 0};
  std::vector<Span>& spans_;
  int& peak_;
  int& peak_w_;

  // Deferred weight gradients (PipelineOptions::defer_weight_grads): this device's linear layers
  // stash theirs during the list; each flush computes them, traced as a W of no micro-batch.
  models::WeightGradStash& stash_;
  std::optional<models::DeferWeightGrads> deferring_;

  std::vector<size_t> reducing_;  // spans of the reductions started
  // A context that times its device (CUDA): the computes' spans as the device ran them, read
  // after the list from stamps around each, relative to one taken at the start, stream idle.
  struct Stamped {
    size_t span;
    stages::Stamp began, ended;
  };
  std::vector<Stamped> stamped_;
  stages::Stamp origin_;
  int64_t faults_before_ = 0;
  bool first_action_ = true;
};

}  // namespace pipetrain::pipeline
