// Internal to the pipeline module: the runner of one local device, for the executor (executor.h).
// The runner owns what the device keeps from step to step (its device context, its worker, its
// transport endpoint, its deferred weight gradients, the marks of the messages sent to it; its
// virtual stages, by chunk) and what lives only while a list runs on it (a training step's or an
// evaluation's): the per-micro-batch buffers (inputs received and their markers, results waiting
// for their send, output gradients), the hand-over between the device's own chunks, its spans
// and peaks and the reductions it started. Each action kind is one method, found through a table
// by the action's op; run() is the list, begin and end. The messages across a cut are in
// messages.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "models/weight_grads.h"
#include "pipeline/pipeline.h"
#include "pipeline/replicas.h"
#include "pipeline/worker.h"
#include "stages/autocast.h"
#include "stages/device.h"
#include "stages/stage.h"

namespace pipetrain::pipeline {

using schedule::Op;
using Skips = stages::Skips;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
struct ClearAutocastCache {  // on the thread that ran the forwards (stages/autocast.h)
  ~ClearAutocastCache() { stages::clear_autocast_cache(); }
};

// What a list of actions is run for: a training step (forward with the loss, backward) or an
// evaluation (forward only, no gradients, the layers in evaluation mode).
enum class Pass { Train, Evaluate };

// Hands tensors between two virtual stages of one device (the turn of a V placement, or a
// device that holds consecutive chunks): no transfer, the sending action leaves it here and the
// receiving action takes it.
struct LocalHandoff {
  std::map<std::tuple<int, int, int>, at::Tensor> held;  // (kind, micro-batch, chunk there)
  void put(comm::Kind kind, int m, int chunk, at::Tensor t) { held[{static_cast<int>(kind), m, chunk}] = std::move(t); }
  at::Tensor take(comm::Kind kind, int m, int chunk) {
    auto it = held.find({static_cast<int>(kind), m, chunk});
    if (it == held.end()) throw Error(detail::concat("pipeline: nothing handed over for micro-batch ", m, " chunk ", chunk));
    at::Tensor t = std::move(it->second);
    held.erase(it);
    return t;
  }
};

// The step being run, which the runners of one copy share: the micro-batches of the batch
// (read-only), what each one gets (its first sample's place in the whole batch, for the dropout
// streams, and its loss weight) and what the last stage leaves (a step's losses, an
// evaluation's outputs).
struct StepIO {
  int64_t step = 0;  // the training step: the dropout streams and the fault points
  bool accumulate = false;  // keep the gradients already there
  std::vector<at::Tensor> inputs, targets, outputs;
  std::vector<int64_t> offsets;
  std::vector<double> weights, losses;
  std::vector<at::Tensor> loss_values;  // the last stage's, on its device: read once, at the end of its list
};

class DeviceRunner;

// How the runners of one copy reach each other, read by each: the skips crossing each cut,
// whom to address each device at, and (in-process) every device's runner, whose inbox takes the
// marks of the messages sent to it.
struct Wiring {
  std::vector<std::vector<std::string>> crossing;  // by cut (after virtual stage b), in name order (models/skip.h)
  std::vector<int> ranks;  // by device: its rank, the device itself in-process
  bool processes = false;  // one rank per stage (else in-process, over the local transport)
  bool marking = false;  // some stage here runs on a GPU, whose work its marks follow
  std::vector<DeviceRunner*> runners;  // in-process, by device
};
// At most 62 skips cross a cut and 255 chunks: each part of a message has a channel of its own.
void check_crossing(const std::vector<std::vector<std::string>>& crossing, int chunks);

class DeviceRunner {
 public:
  // `stages`: the device's virtual stages by chunk. `memory_account`: its worker's, and
  // `on_caller` a worker without a thread of its own (worker.h). `reducers`: by virtual stage,
  // the copy's gradient reductions, started at the Reduce actions while `sync` says so.
  DeviceRunner(int device, std::unique_ptr<stages::DeviceContext> context, std::unique_ptr<comm::Transport> endpoint,
               std::vector<stages::Stage*> stages, const PipelineOptions& options, int memory_account, bool on_caller,
               const Wiring& wiring, StepIO& io, const std::vector<std::unique_ptr<GradientReducer>>& reducers,
               const bool& sync);

  // Runs the device's whole list (on the calling thread; the executor calls it on worker()): the
  // stages' step begins, every action in order (each through its handler), then the deferred
  // weight gradients, the losses read once, the device's stamps resolved and the reductions
  // waited for. A training step's spans and peaks go to the device's slots of `trace`.
  void run(const schedule::Schedule& lists, Pass pass, int64_t tag_step, Clock::time_point t0, StepTrace& trace);

  int device() const { return r_; }
  stages::DeviceContext& context() { return *context_; }
  Worker& worker() { return *worker_; }
  comm::Transport& endpoint() { return *endpoint_; }
  void renew_endpoint(std::unique_ptr<comm::Transport> endpoint) { endpoint_ = std::move(endpoint); }  // fresh mailboxes
  // In-process, a message from another device carries the sender's mark, which this device's
  // context waits for: (kind, micro-batch, channel, step tag).
  using MarkKey = std::tuple<int, int, int, int64_t>;
  void post_mark(const MarkKey& key, stages::Marker mark);
  void clear_marks();  // a failed step's, never received

 private:
  using Key = std::pair<int, int>;  // (micro-batch, chunk)
  using Handler = void (DeviceRunner::*)(const schedule::Action&, int vs, const Key&);

  static Handler handler(schedule::Op op);  // the table
  void begin();
  void finish();
  void clear_list();  // the list's buffers, once it ended

  // The actions (one per schedule::Op).
  void recv_activation(const schedule::Action& a, int vs, const Key& key);
  void forward(const schedule::Action& a, int vs, const Key& key);
  void send_activation(const schedule::Action& a, int vs, const Key& key);
  void recv_grad(const schedule::Action& a, int vs, const Key& key);
  void backward(const schedule::Action& a, int vs, const Key& key);  // fused, or B of a split backward
  void backward_weight(const schedule::Action& a, int vs, const Key& key);
  void send_grad(const schedule::Action& a, int vs, const Key& key);
  void reduce(const schedule::Action& a, int vs, const Key& key);

  // Micro-batch m's message across the cut after virtual stage `boundary`, towards virtual stage
  // `to_vs` (kind Activation: forward; Grad: backward): the tensor, then the skips crossing
  // there in name order, each on a channel of its own (messages.cpp).
  void send_across(comm::Kind kind, int to_vs, int boundary, int m, const at::Tensor& t, const Skips& skips);
  // The same message received on this device's chunk `chunk_here`, from virtual stage `from_vs`,
  // through the device's context: its tensors may be read once the markers left in `ready` are
  // waited for.
  at::Tensor recv_across(comm::Kind kind, int from_vs, int chunk_here, int boundary, int m, Skips* skips,
                         std::vector<stages::Marker>& ready);
  stages::Marker take_mark(const MarkKey& key);

  void wait_all(std::map<Key, std::vector<stages::Marker>>& ready, const Key& key);
  at::Tensor bring(const at::Tensor& t);  // a batch's tensor from the host (or the caller's device)
  // Micro-batch m's input (a first stage's) or target (a last stage's), brought ahead by
  // prefetch_next() or now.
  at::Tensor batch_tensor(std::map<int, stages::Received>& ahead, const std::vector<at::Tensor>& all, int m);
  // Starts bringing the batch's tensors of the device's next forward after action `at_` onto the
  // device (the context's copy stream on a GPU), so that the copy overlaps the forward at hand.
  void prefetch_next();
  void flush_weight_grads();
  void trace_action(const schedule::Action& a, int vs, double start, const stages::Stamp& began);

  // Kept from step to step. The context outlives the worker that enters it.
  const int r_;
  const PipelineOptions& options_;
  const Wiring& wiring_;
  StepIO& io_;
  const std::vector<std::unique_ptr<GradientReducer>>& reducers_;
  const bool& sync_;  // accumulating without it: the gradients are reduced after a later batch
  std::unique_ptr<stages::DeviceContext> context_;
  std::unique_ptr<comm::Transport> endpoint_;
  std::unique_ptr<Worker> worker_;
  std::vector<stages::Stage*> mine_;  // this device's virtual stages, by chunk
  // Deferred weight gradients (PipelineOptions::defer_weight_grads): this device's linear layers
  // stash theirs during a list; each flush computes them, traced as a W of no micro-batch.
  models::WeightGradStash stash_;
  std::mutex marks_mu_;
  std::map<MarkKey, stages::Marker> marks_;

  // The list being run.
  const schedule::Schedule* lists_ = nullptr;
  bool training_ = false;
  int64_t tag_step_ = 0;
  Clock::time_point t0_;
  // received: inputs and output gradients waiting for their compute; outbox: results
  // (activations, input gradients) waiting for their send action.
  std::map<Key, at::Tensor> received_, outbox_, grads_;
  std::map<Key, stages::Skips> received_skips_, outbox_skips_, grad_skips_;  // the skips crossing with each
  std::map<Key, std::vector<stages::Marker>> received_ready_, grad_ready_;  // waited for before use
  std::map<int, stages::Received> inputs_ahead_, targets_ahead_;  // by micro-batch: prefetch_next()
  size_t at_ = 0;  // the action being run, its index in the device's list
  LocalHandoff local_;  // between this device's own virtual stages
  // An evaluation leaves the training step's trace as it was.
  std::vector<Span> evaluation_spans_;
  int evaluation_peaks_[2] = {0, 0};
  std::vector<Span>* spans_ = nullptr;
  int* peak_ = nullptr;
  int* peak_w_ = nullptr;
  StepTrace* trace_ = nullptr;
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
  int64_t reads_before_ = 0;  // the context's host reads when the list began
  bool first_action_ = true;
};

}  // namespace pipetrain::pipeline
