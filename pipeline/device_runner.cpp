// One device's runner and its run of an action list (device_runner.h).
#include "pipeline/device_runner.h"

#include <sys/resource.h>

#include <algorithm>
#include <array>

#include <torch/torch.h>

#include "common/error.h"
#include "common/fault.h"
#include "models/layers.h"
#include "stages/accelerator.h"
#include "stages/library_warnings.h"

namespace pipetrain::pipeline {

namespace {
int64_t thread_minor_faults() {
  rusage u{};
  return getrusage(RUSAGE_THREAD, &u) == 0 ? static_cast<int64_t>(u.ru_minflt) : 0;
}

bool computes(Op op) {
  return op == Op::Forward || op == Op::Backward || op == Op::BackwardInput || op == Op::BackwardWeight;
}
}  // namespace

DeviceRunner::DeviceRunner(int device, std::unique_ptr<stages::DeviceContext> context,
                           std::unique_ptr<comm::Transport> endpoint, std::vector<stages::Stage*> stages,
                           const PipelineOptions& options, int memory_account, bool on_caller, const Wiring& wiring,
                           StepIO& io, const std::vector<std::unique_ptr<GradientReducer>>& reducers, const bool& sync)
    : r_(device),
      options_(options),
      wiring_(wiring),
      io_(io),
      reducers_(reducers),
      sync_(sync),
      context_(std::move(context)),
      endpoint_(std::move(endpoint)),
      worker_(std::make_unique<Worker>(detail::concat("stage ", device), options.intra_op_threads, memory_account,
                                       context_.get(), on_caller)),
      mine_(std::move(stages)),
      stash_(options.defer_min_bytes) {}

void DeviceRunner::post_mark(const MarkKey& key, stages::Marker mark) {
  std::lock_guard<std::mutex> lock(marks_mu_);
  marks_[key] = std::move(mark);
}

stages::Marker DeviceRunner::take_mark(const MarkKey& key) {
  std::lock_guard<std::mutex> lock(marks_mu_);
  stages::Marker mark;
  auto it = marks_.find(key);
  if (it != marks_.end()) {
    mark = std::move(it->second);
    marks_.erase(it);
  }
  return mark;
}

void DeviceRunner::clear_marks() {
  std::lock_guard<std::mutex> lock(marks_mu_);
  marks_.clear();
}

DeviceRunner::Handler DeviceRunner::handler(Op op) {
  static const std::array<Handler, 9> table = [] {
    std::array<Handler, 9> t{};
    t[static_cast<size_t>(Op::RecvActivation)] = &DeviceRunner::recv_activation;
    t[static_cast<size_t>(Op::Forward)] = &DeviceRunner::forward;
    t[static_cast<size_t>(Op::SendActivation)] = &DeviceRunner::send_activation;
    t[static_cast<size_t>(Op::RecvGrad)] = &DeviceRunner::recv_grad;
    t[static_cast<size_t>(Op::Backward)] = &DeviceRunner::backward;
    t[static_cast<size_t>(Op::BackwardInput)] = &DeviceRunner::backward;
    t[static_cast<size_t>(Op::BackwardWeight)] = &DeviceRunner::backward_weight;
    t[static_cast<size_t>(Op::SendGrad)] = &DeviceRunner::send_grad;
    t[static_cast<size_t>(Op::Reduce)] = &DeviceRunner::reduce;
    return t;
  }();
  const auto i = static_cast<size_t>(op);
  if (i >= table.size() || !table[i]) throw Error(detail::concat("pipeline: no handler for action kind ", static_cast<int>(op)));
  return table[i];
}

void DeviceRunner::run(const schedule::Schedule& lists, Pass pass, int64_t tag_step, Clock::time_point t0,
                       StepTrace& trace) {
  lists_ = &lists;
  training_ = pass == Pass::Train;
  tag_step_ = tag_step;
  t0_ = t0;
  trace_ = &trace;
  spans_ = training_ ? &trace.spans[r_] : &evaluation_spans_;
  peak_ = training_ ? &trace.peak_in_flight[r_] : &evaluation_peaks_[0];
  peak_w_ = training_ ? &trace.peak_awaiting_weight[r_] : &evaluation_peaks_[1];
  struct Clear {  // the list's buffers die with it, a failed one's too
    DeviceRunner& runner;
    ~Clear() { runner.clear_list(); }
  } clear{*this};
  faults_before_ = thread_minor_faults();
  begin();
  std::optional<torch::NoGradGuard> no_grad;
  if (!training_) no_grad.emplace();
  ClearAutocastCache clear_cache;  // the stage thread's autocast copies of the weights die with the step
  origin_ = context_->stamp(seconds_since(t0_));
  reads_before_ = context_->host_reads();
  for (at_ = 0; at_ < lists.actions[r_].size(); ++at_) {
    const schedule::Action& a = lists.actions[r_][at_];
    const Key key{a.micro_batch, a.chunk};
    const int vs = lists.virtual_stage(r_, a.chunk);
    if (a.op == Op::Reduce) {
      reduce(a, vs, key);
      continue;
    }
    // A compute's inputs first (the stream waits for them), so that its device time is its own.
    if (a.op == Op::Forward) wait_all(received_ready_, key);
    if (a.op == Op::Backward || a.op == Op::BackwardInput) wait_all(grad_ready_, key);
    const double start = seconds_since(t0_);
    stages::Stamp began;
    if (computes(a.op)) began = context_->stamp(start);
    try {
      const stages::ProfilerRange range(detail::concat("stage ", vs, " ", schedule::to_string(a)));
      (this->*handler(a.op))(a, vs, key);
    } catch (const Error&) {
      throw;
    } catch (const c10::Error& e) {  // a libtorch error inside a layer: say where it happened
      throw Error(detail::concat("stage ", r_, ": ", schedule::to_string(a), training_ ? "" : " (evaluation)", ": ",
                                 stages::library_message_line(e.what_without_backtrace())));
    } catch (const std::runtime_error& e) {  // the TorchScript interpreter's errors (a scripted layer)
      throw Error(detail::concat("stage ", r_, ": ", schedule::to_string(a), training_ ? "" : " (evaluation)", ": ",
                                 stages::library_message_line(e.what())));
    }
    trace_action(a, vs, start, began);
  }
  finish();
}

void DeviceRunner::clear_list() {
  received_.clear();
  outbox_.clear();
  grads_.clear();
  received_skips_.clear();
  outbox_skips_.clear();
  grad_skips_.clear();
  received_ready_.clear();
  grad_ready_.clear();
  local_.held.clear();
  inputs_ahead_.clear();
  targets_ahead_.clear();
  deferring_.reset();
  reducing_.clear();
  stamped_.clear();
  first_action_ = true;
}

void DeviceRunner::begin() {
  if (training_)
    for (stages::Stage* st : mine_) {
      st->begin_step(options_.seed, io_.step, lists_->micro_batches);
      models::reset_batch_norm(*st->layers());  // e.g. forwards run outside a step (profiling)
      if (!io_.accumulate)
        for (auto& param : st->layers()->parameters()) param.mutable_grad() = at::Tensor();
    }
  spans_->clear();
  *peak_ = *peak_w_ = 0;
  if (training_ && options_.defer_weight_grads) {
    stash_.clear();  // a failed step's
    deferring_.emplace(&stash_);
  }
}

void DeviceRunner::trace_action(const schedule::Action& a, int vs, double start, const stages::Stamp& began) {
  int held = 0, awaiting = 0;
  for (stages::Stage* st : mine_) {
    held += static_cast<int>(st->held());
    awaiting += static_cast<int>(st->held() + st->awaiting_weight());
  }
  *peak_ = std::max(*peak_, held);
  *peak_w_ = std::max(*peak_w_, awaiting);
  const bool backward = a.op == Op::Backward || a.op == Op::BackwardInput;
  spans_->push_back({a.op, a.micro_batch, a.chunk, start, seconds_since(t0_),
                     backward ? mine_[a.chunk]->last_recompute_s() : 0.0});
  if (computes(a.op) && began.impl) stamped_.push_back({spans_->size() - 1, began, context_->stamp(spans_->back().end)});
  if (first_action_ && training_) fault_point("pipeline.step", r_, io_.step);  // common/fault.h
  first_action_ = false;
}

void DeviceRunner::wait_all(std::map<Key, std::vector<stages::Marker>>& ready, const Key& key) {
  auto it = ready.find(key);
  if (it == ready.end()) return;
  for (const auto& mk : it->second) context_->wait(mk);
  ready.erase(it);
}

at::Tensor DeviceRunner::bring(const at::Tensor& t) {
  stages::Received got = context_->receive(t, {});
  context_->wait(got.ready);
  return got.tensor;
}

at::Tensor DeviceRunner::batch_tensor(std::map<int, stages::Received>& ahead, const std::vector<at::Tensor>& all,
                                      int m) {
  auto it = ahead.find(m);
  if (it == ahead.end()) return bring(all.at(m));
  stages::Received got = std::move(it->second);
  ahead.erase(it);
  context_->wait(got.ready);
  return got.tensor;
}

void DeviceRunner::prefetch_next() {
  const auto& list = lists_->actions[r_];
  for (size_t i = at_ + 1; i < list.size(); ++i) {
    const schedule::Action& next = list[i];
    if (next.op != Op::Forward) continue;
    const stages::Stage& stage = *mine_[next.chunk];
    const int m = next.micro_batch;
    if (stage.is_first() && !inputs_ahead_.count(m)) inputs_ahead_.emplace(m, context_->receive(io_.inputs.at(m), {}));
    if (training_ && stage.is_last() && !targets_ahead_.count(m))
      targets_ahead_.emplace(m, context_->receive(io_.targets.at(m), {}));
    return;
  }
}

void DeviceRunner::flush_weight_grads() {
  if (stash_.empty()) return;
  const double start = seconds_since(t0_);
  stash_.flush();
  spans_->push_back({Op::BackwardWeight, -1, 0, start, seconds_since(t0_), 0.0});
}

void DeviceRunner::recv_activation(const schedule::Action& a, int vs, const Key& key) {
  received_[key] = recv_across(comm::Kind::Activation, vs - 1, a.chunk, vs - 1, a.micro_batch, &received_skips_[key],
                               received_ready_[key]);
}

void DeviceRunner::forward(const schedule::Action& a, int, const Key& key) {
  stages::Stage& stage = *mine_[a.chunk];
  const int m = a.micro_batch;
  at::Tensor in = stage.is_first() ? batch_tensor(inputs_ahead_, io_.inputs, m) : received_.at(key);
  received_.erase(key);
  const at::Tensor target =
      training_ && stage.is_last() ? batch_tensor(targets_ahead_, io_.targets, m) : at::Tensor();
  prefetch_next();  // the next forward's batch tensors come in while this one computes
  stages::Skips passed_on;
  at::Tensor out = training_ ? stage.forward(m, in, io_.offsets[m], target, io_.weights[m], received_skips_[key], &passed_on)
                             : stage.forward_only(in, received_skips_[key], &passed_on);
  received_skips_.erase(key);
  if (stage.is_last()) {
    if (training_)
      io_.loss_values[m] = out.detach();  // read at the end of the list, not per micro-batch
    else
      io_.outputs[m] = out;
  } else {
    outbox_[key] = out;
    outbox_skips_[key] = std::move(passed_on);
  }
}

void DeviceRunner::send_activation(const schedule::Action& a, int vs, const Key& key) {
  send_across(comm::Kind::Activation, vs + 1, vs, a.micro_batch, outbox_.at(key), outbox_skips_[key]);
  outbox_.erase(key);
  outbox_skips_.erase(key);
}

void DeviceRunner::recv_grad(const schedule::Action& a, int vs, const Key& key) {
  grads_[key] = recv_across(comm::Kind::Grad, vs + 1, a.chunk, vs, a.micro_batch, &grad_skips_[key], grad_ready_[key]);
}

void DeviceRunner::backward(const schedule::Action& a, int, const Key& key) {
  stages::Stage& stage = *mine_[a.chunk];
  at::Tensor g = stage.is_last() ? at::Tensor() : grads_.at(key);
  grads_.erase(key);
  stages::Skips skip_grads_in;
  at::Tensor gin = a.op == Op::Backward ? stage.backward(a.micro_batch, g, grad_skips_[key], &skip_grads_in)
                                        : stage.backward_input(a.micro_batch, g, grad_skips_[key], &skip_grads_in);
  grad_skips_.erase(key);
  if (!stage.is_first()) {
    outbox_[key] = gin;
    outbox_skips_[key] = std::move(skip_grads_in);
  }
}

void DeviceRunner::backward_weight(const schedule::Action& a, int, const Key&) {
  mine_[a.chunk]->backward_weight(a.micro_batch);
}

void DeviceRunner::send_grad(const schedule::Action& a, int vs, const Key& key) {
  send_across(comm::Kind::Grad, vs - 1, vs - 1, a.micro_batch, outbox_.at(key), outbox_skips_[key]);
  outbox_.erase(key);
  outbox_skips_.erase(key);
}

// Starts the chunk's reduction across its copies; it runs beside the actions after it and is
// waited for in finish(). One held for ties (GradientReducer::hold_for_ties) runs at the
// optimizer step instead, after the ties' sum.
void DeviceRunner::reduce(const schedule::Action& a, int vs, const Key&) {
  if (!sync_) return;  // accumulating: the gradients are reduced after a later batch
  flush_weight_grads();  // the chunk's gradients whole before they are reduced
  auto& reducer = reducers_[vs];
  if (reducer && reducer->held()) return;
  const double start = seconds_since(t0_);
  if (reducer) reducer->start();
  fault_point("pipeline.reduce", wiring_.ranks[r_], io_.step);  // common/fault.h: a copy that dies mid-reduction
  spans_->push_back({a.op, -1, a.chunk, start, start, 0.0});
  reducing_.push_back(spans_->size() - 1);
}

void DeviceRunner::finish() {
  flush_weight_grads();
  if (training_) {
    trace_->host_reads[r_] = context_->host_reads() - reads_before_;
    trace_->graphed[r_] = 0;
    for (const stages::Stage* st : mine_) trace_->graphed[r_] += st->graphed_forwards();
  }
  // The step's losses, read from the device once (one host synchronization per step).
  const int M = lists_->micro_batches;
  const bool has_losses =
      training_ && std::any_of(mine_.begin(), mine_.end(), [](const stages::Stage* st) { return st->is_last(); });
  if (has_losses && M == 1) {
    io_.losses[0] = context_->to_host(io_.loss_values.at(0).to(at::kDouble)).item<double>();  // one read, no stack
  } else if (has_losses && M > 1) {
    std::vector<at::Tensor> values;
    for (int m = 0; m < M; ++m) values.push_back(io_.loss_values.at(m).reshape({}));
    const at::Tensor all = context_->to_host(torch::stack(values).to(at::kDouble));
    for (int m = 0; m < M; ++m) io_.losses[m] = all.data_ptr<double>()[m];
  }
  if (!stamped_.empty()) {
    context_->synchronize();  // once per step, as the worker would at the job's end
    for (const Stamped& st : stamped_) {
      Span& sp = (*spans_)[st.span];
      sp.start = stages::DeviceContext::resolve(origin_, st.began);
      sp.end = std::max(sp.start, stages::DeviceContext::resolve(origin_, st.ended));
    }
  }
  // The optimizer needs the reductions: wait for them here, after the last action.
  const double t0_s = std::chrono::duration<double>(t0_.time_since_epoch()).count();
  for (size_t i : reducing_) {
    Span& sp = (*spans_)[i];
    auto& reducer = reducers_[lists_->virtual_stage(r_, sp.chunk)];
    sp.end = reducer ? reducer->finish(Deadline::after(options_.timeout_s)) - t0_s : seconds_since(t0_);
  }
  if (training_) trace_->page_faults[r_] = thread_minor_faults() - faults_before_;
}

}  // namespace pipetrain::pipeline
