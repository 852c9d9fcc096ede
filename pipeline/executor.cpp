// The executor (executor.h): construction of the stages and of a runner per local device
// (device_runner.h), and the action lists run on the runners, for a training step and an
// evaluation alike.
#include "pipeline/executor.h"

#include <algorithm>
#include <cmath>
#include <atomic>
#include <limits>
#include <map>
#include <optional>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "common/error.h"
#include "common/fault.h"
#include "models/layers.h"
#include "models/skip.h"
#include "schedule/in_order.h"
#include "stages/library_warnings.h"

namespace pipetrain::pipeline {

namespace {
// The in-process group the stages talk over; a c10d group's own timeout is the pipeline's.
std::vector<std::unique_ptr<comm::Transport>> stage_transports(const PipelineOptions& o) {
  comm::TransportOptions t = o.transport;
  t.timeout_s = o.timeout_s;
  return comm::make_transport_group(t, o.stages);
}
}  // namespace

void Executor::init(torch::nn::Sequential model, PipelineOptions options, stages::LossFn loss,
                    std::unique_ptr<comm::Transport>& endpoint, std::vector<comm::ProcessGroup> device_groups, int copy) {
  options_ = std::move(options);
  model_ = model;
  dp_.copy = copy;
  dp_.device_groups = std::move(device_groups);
  check_options(model);
  const int layers = static_cast<int>(model->size());
  const int V = options_.stages * options_.chunks;
  dp_.mesh = comm::Mesh{options_.stages, options_.data_parallel};
  opt_.scaler = LossScaler(options_.loss_scale);
  balance_ = options_.balance.empty() ? partitioner::uniform(layers, V) : options_.balance;
  partitioner::check(balance_, layers, V, "pipeline");
  // Skip connections: declared by the layers, or given by hand for layers that do not declare.
  if (!options_.skips.empty()) models::check_skips(options_.skips, layers, "pipeline: skips");
  wiring_.crossing = models::skips_crossing(options_.skips.empty() ? models::skips_of(model) : options_.skips,
                                            partitioner::offsets(balance_));
  check_crossing(wiring_.crossing, options_.chunks);
  ties_.init(model, options_.ties, balance_);
  sched_ = schedule::pipeline_schedule(options_.schedule, options_.stages, options_.micro_batches, options_.chunks,
                                       dp_.mesh.data_parallel);
  schedule::validate(sched_);
  check_delivery(sched_);
  configured_ = sched_;
  if (endpoint) {
    join_ranks(endpoint, layers);
  } else {
    for (int r = 0; r < options_.stages; ++r) local_.push_back(r);
  }
  make_stages(model, loss);
  opt_.optimizers.resize(V);
  make_runners();
  trace_.spans.resize(options_.stages);
  trace_.peak_in_flight.assign(options_.stages, 0);
  trace_.optimizer.assign(options_.stages, {0.0, 0.0});
  trace_.peak_awaiting_weight.assign(options_.stages, 0);
  trace_.page_faults.assign(options_.stages, -1);
  trace_.host_reads.assign(options_.stages, -1);
  trace_.graphed.assign(options_.stages, -1);
  if (dp_.mesh.data_parallel > 1) make_reducers();
}

void Executor::check_options(const torch::nn::Sequential& model) const {
  const PipelineOptions& o = options_;
  if (o.stages < 1) throw ConfigError(detail::concat("pipeline: stages must be >= 1, got ", o.stages));
  if (o.micro_batches < 1)
    throw ConfigError(detail::concat("pipeline: micro_batches must be >= 1, got ", o.micro_batches));
  if (o.data_parallel < 1)
    throw ConfigError(detail::concat("pipeline: data_parallel must be >= 1, got ", o.data_parallel));
  try {
    schedule::check_supported(o.schedule, o.stages, o.micro_batches, o.chunks);
  } catch (const ScheduleError& e) {
    throw ConfigError(std::string("pipeline: ") + e.what());
  }
  // Frozen weights may be kept in the precision's own type (models::store_frozen).
  if (o.precision != Precision::FP32)
    for (const auto& t : model->parameters())
      if (t.scalar_type() != torch::kFloat &&
          (t.requires_grad() || t.scalar_type() != (o.precision == Precision::BF16 ? torch::kBFloat16 : torch::kHalf)))
        throw ConfigError(detail::concat("pipeline: precision ", precision_name(o.precision),
                                         " keeps float32 master weights, but the model's parameters are ",
                                         c10::toString(t.scalar_type())));
  const int layers = static_cast<int>(model->size()), V = o.stages * o.chunks;
  if (V > layers)
    throw ConfigError(detail::concat("pipeline: ", o.stages, " stages",
                                     o.chunks > 1 ? detail::concat(" x ", o.chunks, " chunks") : "",
                                     " need at least ", V, " layers but the model has only ", layers));
}

std::string cuda_graphs_refused(const PipelineOptions& o, const c10::Device& device) {
  if (!device.is_cuda()) return detail::concat("a stage on ", device.str(), " (graphs replay a GPU's kernels)");
  if (o.recompute != Recompute::Never)
    return detail::concat("recompute ", recompute_name(o.recompute), " (a graph keeps every micro-batch's activations; use never)");
  if (schedule::splits_backward(o.schedule))
    return detail::concat("schedule ", schedule::name(o.schedule), " splits the backward (graphs capture it whole)");
  if (o.defer_weight_grads) return "deferred weight gradients";
  return "";
}

// Multi-process: this rank's place in the mesh, its endpoint, and the layout every rank runs.
void Executor::join_ranks(std::unique_ptr<comm::Transport>& endpoint, int layers) {
  const comm::Mesh& mesh = dp_.mesh;
  if (endpoint->world_size() != mesh.world())
    throw ConfigError(detail::concat("pipeline: ", options_.stages, " stages",
                                     mesh.data_parallel > 1 ? detail::concat(" x ", mesh.data_parallel, " copies") : "",
                                     " need ", mesh.world(), " ranks, one per stage", mesh.data_parallel > 1 ? " and copy" : "",
                                     ", but this rank's world has ", endpoint->world_size()));
  self_ = mesh.stage_of(endpoint->rank());
  dp_.copy = mesh.copy_of(endpoint->rank());
  local_ = {self_};
  taken_ = std::move(endpoint);
  group_ = comm::Collectives(*taken_, options_.timeout_s);
  agree_layout(layers);
}

void Executor::make_stages(const torch::nn::Sequential& model, const stages::LossFn& loss) {
  const int V = static_cast<int>(balance_.size());
  auto off = partitioner::offsets(balance_);
  auto children = model->named_children();
  for (int vs = 0; vs < V; ++vs) {
    torch::nn::Sequential slice;
    // AnyModule copies share the module: the stages train the caller's own layers.
    for (int i = off[vs]; i < off[vs + 1]; ++i) slice->push_back(children[i].key(), *(model->begin() + i));
    stages_.push_back(std::make_unique<stages::Stage>(vs, V, slice, options_.recompute));
    stages_.back()->set_precision(options_.precision);
  }
  stages_.back()->set_loss(loss);
  if (self_ < 0) return;
  // Another rank trains those layers: their tensors are released here, so that a rank holds
  // only its own stages' parameters and buffers (the model was built whole, for the seed).
  torch::NoGradGuard no_grad;
  for (int vs = 0; vs < V; ++vs) {
    if (runs(vs)) continue;
    for (auto& t : stages_[vs]->layers()->parameters()) t.set_data(at::empty({0}, t.options()));
    for (auto& t : stages_[vs]->layers()->buffers()) t.set_data(at::empty({0}, t.options()));
  }
}

std::vector<std::unique_ptr<stages::DeviceContext>> Executor::make_contexts() {
  const int S = options_.stages;
  if (!options_.devices.empty() && options_.devices.size() != 1 && static_cast<int>(options_.devices.size()) != S)
    throw ConfigError(detail::concat("pipeline: ", options_.devices.size(), " devices for ", S,
                                     " stages; give one for every stage, or one for all"));
  std::vector<c10::Device> devices;
  for (int r = 0; r < S; ++r)
    devices.push_back(options_.devices.empty() ? c10::Device(c10::kCPU)
                                               : options_.devices[options_.devices.size() == 1 ? 0 : static_cast<size_t>(r)]);
  bool gpus = false;
  for (int r : local_) gpus = gpus || !devices[r].is_cpu();
  if (gpus && options_.checking_contexts)
    throw ConfigError("pipeline: the checking device context runs stages on the CPU only");
  // A GPU's backward runs on the autograd engine's device thread, which the stage's stash is not
  // in place on; and the traffic it saves is a CPU's.
  if (gpus && options_.defer_weight_grads)
    throw ConfigError("pipeline: defer_weight_grads works on CPU stages only");
  std::vector<std::unique_ptr<stages::DeviceContext>> contexts(S);
  for (int r : local_) contexts[r] = stages::make_device_context(devices[r], options_.checking_contexts);
  wiring_.marking = gpus;
  torch::NoGradGuard no_grad;
  for (int vs = 0; vs < static_cast<int>(stages_.size()); ++vs)
    if (runs(vs)) stages_[vs]->layers()->to(devices[sched_.device_of(vs)]);  // tensors already there stay
  if (options_.cuda_graphs)
    for (int vs = 0; vs < static_cast<int>(stages_.size()); ++vs)
      if (runs(vs)) stages_[vs]->use_cuda_graphs(cuda_graphs_refused(options_, devices[sched_.device_of(vs)]));
  return contexts;
}

void Executor::make_runners() {
  const int S = options_.stages;
  auto contexts = make_contexts();
  std::vector<std::unique_ptr<comm::Transport>> endpoints(S);
  if (self_ < 0)
    endpoints = stage_transports(options_);
  else
    endpoints[self_] = std::move(taken_);
  wiring_.processes = self_ >= 0;
  wiring_.ranks.clear();
  for (int r = 0; r < S; ++r) wiring_.ranks.push_back(peer(r));
  runners_.resize(S);
  wiring_.runners.assign(S, nullptr);
  // Each copy's stage r allocates into memory account copy * stages + r (bench's peak per device).
  // One stage in this process has nothing to overlap: it runs on the calling thread (Worker's note).
  const bool on_caller = self_ < 0 && S == 1;
  for (int r : local_) {
    std::vector<stages::Stage*> mine;
    for (int c = 0; c < sched_.chunks; ++c) mine.push_back(stages_[sched_.virtual_stage(r, c)].get());
    runners_[r] = std::make_unique<DeviceRunner>(r, std::move(contexts[r]), std::move(endpoints[r]), std::move(mine),
                                                 options_, (self_ >= 0 ? 0 : dp_.copy) * S + r, on_caller, wiring_, io_,
                                                 dp_.reducers, dp_.sync);
    wiring_.runners[r] = runners_[r].get();
  }
}

comm::Transport* Executor::endpoint() {
  if (self_ < 0) return nullptr;
  if (taken_) return taken_.get();
  return runners_.size() > static_cast<size_t>(self_) && runners_[self_] ? &runners_[self_]->endpoint() : nullptr;
}

int64_t Executor::take_device_peak(int device) {
  if (device < 0 || device >= static_cast<int>(runners_.size()) || !runners_[device]) return 0;
  stages::DeviceContext& context = runners_[device]->context();
  const int64_t peak = context.peak_bytes();
  context.reset_peak();
  return peak;
}

// Every rank runs rank 0's layout: a balance chosen by profiling may differ between ranks, and
// so may deferred weight gradients where profiling decided them (job's "auto"). The precision
// follows it: ranks that disagree on it would send each other other dtypes.
void Executor::agree_layout(int layers) {
  const int V = static_cast<int>(balance_.size());
  std::vector<int64_t> layout(balance_.begin(), balance_.end());
  layout.push_back(static_cast<int64_t>(options_.precision));
  layout.push_back(options_.defer_weight_grads ? 1 : 0);
  const auto all = group_.all_gather(torch::tensor(layout), "the stage layout");
  const at::Tensor& first = all[0];
  if (first.numel() != V + 2)
    throw Error(detail::concat("pipeline: rank 0 sent a layout of ", first.numel() - 1, " stages, not ", V));
  const int64_t precision0 = first.data_ptr<int64_t>()[V];
  if (precision0 != static_cast<int64_t>(options_.precision))
    throw ConfigError(detail::concat("pipeline: rank ", self_, " runs precision ", precision_name(options_.precision),
                                     " but rank 0 runs ",
                                     precision0 >= 0 && precision0 <= 2 ? precision_name(static_cast<Precision>(precision0))
                                                                        : "an unknown precision"));
  partitioner::Balance chosen(first.data_ptr<int64_t>(), first.data_ptr<int64_t>() + V);
  partitioner::check(chosen, layers, V, "pipeline: rank 0's balance");
  balance_ = chosen;
  options_.defer_weight_grads = first.data_ptr<int64_t>()[V + 1] != 0;
}

void Executor::check_delivery(const schedule::Schedule& s) const {
  if (!options_.transport.in_order) return;
  try {
    schedule::validate_in_order(s);
  } catch (const ScheduleError& e) {
    throw ConfigError(detail::concat("pipeline: a transport that delivers in order cannot run this schedule: ", e.what()));
  }
}

void Executor::check_usable() const {
  if (self_ >= 0 && !group_.failure().empty())
    throw Error(detail::concat("pipeline: rank ", self_, " cannot continue after an earlier failure: ", group_.failure()));
}

// Multi-process: a failure on this rank or a peer's ends the pipeline. Aborting the control
// plane aborts the endpoint, which tells every peer at once, so none waits for its deadline.
void Executor::stop(const std::string& what) {
  if (self_ >= 0) group_.abort(what);
}

void Executor::fail(const std::string& what, std::exception_ptr error) {
  stop(what);
  std::rethrow_exception(error);
}

std::exception_ptr Executor::on_local_devices(const std::function<void(DeviceRunner&)>& job,
                                              std::vector<std::exception_ptr>* errors) {
  std::vector<Worker*> workers(runners_.size(), nullptr);
  for (int r : local_) workers[r] = &runners_[r]->worker();
  return fork_join(workers, local_, [&](int r) { job(*runners_[r]); }, nullptr, errors);
}

int Executor::run_lists(const schedule::Schedule& lists, Pass pass, int64_t tag_step, Clock::time_point t0,
                        std::vector<std::exception_ptr>& errors) {
  on_local_devices(
      [&](DeviceRunner& runner) {
        const int r = runner.device();
        try {
          try {
            runner.run(lists, pass, tag_step, t0, trace_);
          } catch (const ReductionError& e) {
            const std::string cause = abort_notice(r);
            if (cause.empty()) throw;
            throw ReductionError(e.peer(), detail::concat(e.what(), "; meanwhile ", cause));
          }
        } catch (const std::exception& e) {
          int none = -1;
          first_failure_.compare_exchange_strong(none, r);  // before the abort wakes the peers
          runner.endpoint().abort(detail::concat("stage ", r, " failed: ", e.what()));
          throw;
        }
      },
      &errors);
  return first_failure_.exchange(-1);
}

void Executor::fresh_endpoints() {
  auto fresh = stage_transports(options_);
  for (int r : local_) runners_[r]->renew_endpoint(std::move(fresh[r]));
}

// Multi-process: every rank of the world sends its losses, peaks and spans; a rank reads its own
// copy's stages, and the losses of every copy's last stage.
void Executor::exchange_step_results(int M) {
  const StepResult mine{io_.losses, trace_.peak_in_flight[self_], trace_.peak_awaiting_weight[self_], trace_.spans[self_]};
  const auto all = group_.all_gather(torch::tensor(encode_step_result(mine), torch::kDouble), "the step's losses");
  std::map<int, StepResult> results;  // by rank: every copy's last stage, and this copy's stages
  auto result_of = [&](int rank) -> const StepResult& {
    if (auto it = results.find(rank); it != results.end()) return it->second;
    try {
      return results[rank] = decode_step_result(all[rank].data_ptr<double>(), all[rank].numel(), M);
    } catch (const Error& e) {
      fail(detail::concat("rank ", rank, " sent a malformed step result"),
           std::make_exception_ptr(Error(detail::concat("rank ", rank, " sent ", e.what()))));
    }
  };
  dp_.world_loss = 0;
  for (int c = 0; c < dp_.mesh.data_parallel; ++c) {  // every copy's last stage, in copy order
    double copy_loss = 0;  // each copy's sum first, then the copies in order: as in-process
    for (double l : result_of(dp_.mesh.rank(last_device(), c)).losses) copy_loss += l;
    dp_.world_loss += copy_loss;
  }
  for (int d = 0; d < options_.stages; ++d) {
    const StepResult& r = result_of(peer(d));
    if (d == last_device()) io_.losses = r.losses;
    if (d == self_) continue;
    trace_.peak_in_flight[d] = r.peak_in_flight;
    trace_.peak_awaiting_weight[d] = r.peak_awaiting_weight;
    trace_.spans[d] = r.spans;
  }
}

// This copy's shard of the batch into micro-batches, each with its first sample's place in the
// whole batch and its loss weight; returns the micro-batch count.
int Executor::split_batch(const at::Tensor& input, const at::Tensor& target, bool accumulate, double scale) {
  const int64_t N = input.size(0);
  const int D = dp_.mesh.data_parallel;
  if (target.size(0) != N)
    throw ConfigError(detail::concat("pipeline: ", N, " inputs but ", target.size(0), " targets"));
  if (N < D)
    throw ConfigError(detail::concat("pipeline: a batch of ", N, " sample", N == 1 ? "" : "s", " cannot be shared by ",
                                     D, " copies"));
  // A batch smaller than the micro-batch count (an epoch's last) runs as fewer micro-batches:
  // every copy decides alike, from the smallest shard (N / D samples).
  sched_ = schedule_for(static_cast<int>(std::min<int64_t>(configured_.micro_batches, N / D)));
  const int M = sched_.micro_batches;
  fewest_ = accumulate ? std::min(fewest_, M) : M;
  // Data parallelism: this copy's shard of the batch, and where it starts (the dropout streams
  // follow the sample's place in the whole batch).
  at::Tensor shard_input = input, shard_target = target;
  int64_t first_sample = 0;
  if (D > 1) {
    const auto in = input.tensor_split(D, 0), tg = target.tensor_split(D, 0);
    for (int d = 0; d < dp_.copy; ++d) first_sample += in[d].size(0);
    shard_input = in[dp_.copy];
    shard_target = tg[dp_.copy];
  }
  io_.inputs = pinned_for_gpus(shard_input).tensor_split(M, 0);
  io_.targets = pinned_for_gpus(shard_target).tensor_split(M, 0);
  // fp16: the loss is scaled before backward (every rank holds the same scale).
  const double loss_scale = scaling() ? opt_.scaler.scale() : 1.0;
  io_.offsets.assign(M, 0);
  io_.weights.assign(M, 0);
  io_.losses.assign(M, 0);
  io_.loss_values.assign(M, at::Tensor());
  for (int m = 0; m < M; ++m) {
    io_.offsets[m] = m ? io_.offsets[m - 1] + io_.inputs[m - 1].size(0) : first_sample;
    io_.weights[m] = scale * loss_scale * static_cast<double>(io_.inputs[m].size(0)) / static_cast<double>(N);
  }
  io_.accumulate = accumulate;
  return M;
}

// BatchNorm statistics: every micro-batch of a step that succeeded everywhere is folded in at
// once (before any optimizer step); a failed step changes none.
void Executor::settle_batch_norm(bool failed) {
  if (!failed && dp_.mesh.data_parallel > 1) merge_batch_norm();  // over the whole batch, as one device sees it
  for (int vs = 0; vs < static_cast<int>(stages_.size()); ++vs) {
    if (!runs(vs)) continue;  // another rank's
    if (failed)
      models::reset_batch_norm(*stages_[vs]->layers());
    else
      models::commit_batch_norm(*stages_[vs]->layers());
  }
}

double Executor::run_step(const at::Tensor& input, const at::Tensor& target, bool apply_optimizer, bool accumulate,
                          double scale) {
  check_usable();
  const int M = split_batch(input, target, accumulate, scale);
  const double loss_scale = scaling() ? opt_.scaler.scale() : 1.0;
  dp_.reduced = dp_.mesh.data_parallel == 1 || dp_.sync;
  dp_.ties_pending = sharded() && !ties_.empty();  // the tied stages' reductions, at the optimizer step
  for (auto& reducer : dp_.reducers)
    if (reducer) reducer->begin_step(accumulate);

  const auto t0 = Clock::now();
  step_t0_ = t0;
  trace_.step = io_.step;
  trace_.start = std::chrono::duration<double>(t0 - created_).count();
  std::vector<std::exception_ptr> errors;
  const int failed = run_lists(sched_, Pass::Train, io_.step, t0, errors);
  io_.inputs.clear();
  io_.targets.clear();
  io_.loss_values.clear();
  for (int r : local_) runners_[r]->clear_marks();  // a failed step's marks that were never received
  for (auto& o : trace_.optimizer) o = {0.0, 0.0};
  if (self_ >= 0) {
    // Multi-process: the exchange of the last stage's losses also tells every rank that every
    // other finished its list; a failure anywhere ends the pipeline on every rank.
    // Each rank also sends what it measured (peaks and spans), so that rank 0's trace and
    // metrics cover every stage, as in one process. Times are from each rank's own step start.
    if (failed >= 0) fail(detail::concat("step ", io_.step, " failed"), errors[failed]);
    exchange_step_results(M);
  }
  settle_batch_norm(failed >= 0);
  // The optimizers step only once every stage has finished its list, so a failed step leaves
  // every parameter as it was. Each steps in its own worker (its intra-op thread setting).
  try {
    if (failed >= 0) {
      fresh_endpoints();
      std::rethrow_exception(errors[failed]);
    }
    if (apply_optimizer) opt_.grad_norm = step_all(t0);
  } catch (...) {
    trace_.wall = seconds_since(t0);
    ++io_.step;
    throw;
  }
  trace_.wall = seconds_since(t0);
  ++io_.step;
  double loss = 0;
  for (double l : io_.losses) loss += l;
  if (self_ >= 0 && dp_.mesh.data_parallel > 1) loss = dp_.world_loss;
  return loss / loss_scale;
}

// A host batch for GPU stages, pinned once: each micro-batch's slice then reaches its GPU on the
// stage's communication stream without holding the runner's thread (stages/device.h; the caching
// host allocator keeps the memory until the copies have run). CPU stages take it as it is.
at::Tensor Executor::pinned_for_gpus(const at::Tensor& t) const {
  return wiring_.marking && t.is_cpu() && !t.is_pinned() ? t.pin_memory() : t;
}

// A forward-only pass: the batch is split into the configured micro-batches, which flow through
// the stages on schedule::forward_only's lists (each device takes them in order, so none waits
// on a later one), with no gradients, no recomputation and the layers in evaluation mode.
at::Tensor Executor::evaluate(const at::Tensor& input) {
  check_usable();
  const int M = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(options_.micro_batches, input.size(0))));
  const schedule::Schedule lists = schedule::forward_only(configured_, M);
  io_.inputs = pinned_for_gpus(input).tensor_split(M, 0);
  io_.outputs.assign(M, at::Tensor());
  const int64_t tag_step = -(++predictions_);  // never a training step's
  model_->eval();
  std::vector<std::exception_ptr> errors;
  const int failed = run_lists(lists, Pass::Evaluate, tag_step, Clock::now(), errors);
  model_->train();
  io_.inputs.clear();
  std::vector<at::Tensor> out = std::move(io_.outputs);
  io_.outputs.clear();
  if (failed >= 0) {
    if (self_ >= 0) fail("evaluation failed", errors[failed]);
    fresh_endpoints();
    std::rethrow_exception(errors[failed]);
  }
  if (!is_local_device(last_device())) return at::Tensor();
  return M == 1 ? out[0] : torch::cat(out, 0);
}

}  // namespace pipetrain::pipeline
