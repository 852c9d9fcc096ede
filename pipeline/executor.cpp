// The executor (executor.h): construction of the stages, and the action lists run on each local
// device's worker (a DeviceRunner each: device_runner.h), for a training step and an evaluation alike.
#include "pipeline/executor.h"
#include "pipeline/device_runner.h"

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

using schedule::Op;

void Executor::init(torch::nn::Sequential model, PipelineOptions options, stages::LossFn loss,
                          std::unique_ptr<comm::Transport>& endpoint) {
  Executor& p = *this;
  p.options = options;
  p.model = model;
  const int layers = static_cast<int>(model->size());
  if (options.stages < 1)
    throw ConfigError(detail::concat("pipeline: stages must be >= 1, got ", options.stages));
  if (options.micro_batches < 1)
    throw ConfigError(detail::concat("pipeline: micro_batches must be >= 1, got ", options.micro_batches));
  if (options.data_parallel < 1)
    throw ConfigError(detail::concat("pipeline: data_parallel must be >= 1, got ", options.data_parallel));
  p.mesh = comm::Mesh{options.stages, options.data_parallel};
  try {
    schedule::check_supported(options.schedule, options.stages, options.micro_batches, options.chunks);
  } catch (const ScheduleError& e) {
    throw ConfigError(std::string("pipeline: ") + e.what());
  }
  if (options.precision != Precision::FP32)
    for (const auto& t : model->parameters())
      if (t.scalar_type() != torch::kFloat)
        throw ConfigError(detail::concat("pipeline: precision ", precision_name(options.precision),
                                         " keeps float32 master weights, but the model's parameters are ",
                                         c10::toString(t.scalar_type())));
  p.opt.scaler = LossScaler(options.loss_scale);
  const int V = options.stages * options.chunks;
  if (V > layers)
    throw ConfigError(detail::concat("pipeline: ", options.stages, " stages",
                                     options.chunks > 1 ? detail::concat(" x ", options.chunks, " chunks") : "",
                                     " need at least ", V, " layers but the model has only ", layers));
  p.balance = options.balance.empty() ? partitioner::uniform(layers, V) : options.balance;
  partitioner::check(p.balance, layers, V, "pipeline");
  // Skip connections: declared by the layers, or given by hand for layers that do not declare.
  if (!options.skips.empty()) models::check_skips(options.skips, layers, "pipeline: skips");
  p.crossing = models::skips_crossing(options.skips.empty() ? models::skips_of(model) : options.skips,
                                      partitioner::offsets(p.balance));
  p.check_crossing();
  p.init_ties(model);
  p.sched = schedule::pipeline_schedule(options.schedule, options.stages, options.micro_batches, options.chunks,
                                       p.mesh.data_parallel);
  schedule::validate(p.sched);
  p.check_delivery(p.sched);
  p.configured = p.sched;
  if (endpoint) {
    if (endpoint->world_size() != p.mesh.world())
      throw ConfigError(detail::concat("pipeline: ", options.stages, " stages", p.mesh.data_parallel > 1 ? detail::concat(" x ", p.mesh.data_parallel, " copies") : "",
                                       " need ", p.mesh.world(), " ranks, one per stage",
                                       p.mesh.data_parallel > 1 ? " and copy" : "", ", but this rank's world has ", endpoint->world_size()));
    p.self = p.mesh.stage_of(endpoint->rank());
    p.copy = p.mesh.copy_of(endpoint->rank());
    p.local = {p.self};
    p.transports.resize(options.stages);
    p.transports[p.self] = std::move(endpoint);
    p.group = comm::Collectives(*p.transports[p.self], options.timeout_s);
    p.agree_layout(layers);
  } else {
    for (int r = 0; r < options.stages; ++r) p.local.push_back(r);
  }

  auto off = partitioner::offsets(p.balance);
  auto children = model->named_children();
  for (int vs = 0; vs < V; ++vs) {
    torch::nn::Sequential slice;
    // AnyModule copies share the module: the stages train the caller's own layers.
    for (int i = off[vs]; i < off[vs + 1]; ++i) slice->push_back(children[i].key(), *(model->begin() + i));
    p.stages.push_back(std::make_unique<stages::Stage>(vs, V, slice, options.recompute));
    p.stages.back()->set_precision(options.precision);
  }
  p.stages.back()->set_loss(loss);
  if (p.self >= 0) {
    // Another rank trains those layers: their tensors are released here, so that a rank holds
    // only its own stages' parameters and buffers (the model was built whole, for the seed).
    torch::NoGradGuard no_grad;
    for (int vs = 0; vs < V; ++vs) {
      if (p.runs(vs)) continue;
      for (auto& t : p.stages[vs]->layers()->parameters()) t.set_data(at::empty({0}, t.options()));
      for (auto& t : p.stages[vs]->layers()->buffers()) t.set_data(at::empty({0}, t.options()));
    }
  }
  p.opt.optimizers.resize(V);
  if (p.self < 0) p.transports = stage_transports(options);
  p.place_stages();
  p.workers.resize(options.stages);
  p.weight_grads = std::vector<models::WeightGradStash>(options.stages, models::WeightGradStash(options.defer_min_bytes));
  // Each copy's stage r allocates into memory account copy * stages + r (bench's peak per device).
  // One stage in this process has nothing to overlap: it runs on the calling thread (Worker's note).
  const bool on_caller = p.self < 0 && options.stages == 1;
  for (int r : p.local)
    p.workers[r] = std::make_unique<Worker>(detail::concat("stage ", r), options.intra_op_threads,
                                            (p.self >= 0 ? 0 : p.copy) * options.stages + r, p.contexts[r].get(),
                                            on_caller);
  p.trace.spans.resize(options.stages);
  p.trace.peak_in_flight.assign(options.stages, 0);
  p.trace.optimizer.assign(options.stages, {0.0, 0.0});
  p.trace.peak_awaiting_weight.assign(options.stages, 0);
  p.trace.page_faults.assign(options.stages, -1);
  if (p.mesh.data_parallel > 1) {
    if (p.self < 0 && p.copy == 0) p.make_replicas(model, loss);
    p.make_reducers();
  }
}

void Executor::place_stages() {
  const int S = options.stages;
  if (!options.devices.empty() && options.devices.size() != 1 && static_cast<int>(options.devices.size()) != S)
    throw ConfigError(detail::concat("pipeline: ", options.devices.size(), " devices for ", S,
                                     " stages; give one for every stage, or one for all"));
  std::vector<c10::Device> devices;
  for (int r = 0; r < S; ++r)
    devices.push_back(options.devices.empty() ? c10::Device(c10::kCPU)
                                              : options.devices[options.devices.size() == 1 ? 0 : static_cast<size_t>(r)]);
  bool gpus = false;
  for (int r : local) gpus = gpus || !devices[r].is_cpu();
  if (gpus && options.checking_contexts)
    throw ConfigError("pipeline: the checking device context runs stages on the CPU only");
  // A GPU's backward runs on the autograd engine's device thread, which the stage's stash is not
  // in place on; and the traffic it saves is a CPU's.
  if (gpus && options.defer_weight_grads)
    throw ConfigError("pipeline: defer_weight_grads works on CPU stages only");
  contexts.clear();
  contexts.resize(S);
  for (int r : local) contexts[r] = stages::make_device_context(devices[r], options.checking_contexts);
  marking = gpus;
  torch::NoGradGuard no_grad;
  for (int vs = 0; vs < static_cast<int>(stages.size()); ++vs)
    if (runs(vs)) stages[vs]->layers()->to(devices[sched.device_of(vs)]);  // tensors already there stay
}

// Every rank runs rank 0's layout: a balance chosen by profiling may differ between ranks.
// The precision follows it: ranks that disagree on it would send each other other dtypes.
void Executor::agree_layout(int layers) {
  const int V = static_cast<int>(balance.size());
  std::vector<int64_t> layout(balance.begin(), balance.end());
  layout.push_back(static_cast<int64_t>(options.precision));
  const auto all = group.all_gather(torch::tensor(layout), "the stage layout");
  const at::Tensor& first = all[0];
  if (first.numel() != V + 1)
    throw Error(detail::concat("pipeline: rank 0 sent a layout of ", first.numel() - 1, " stages, not ", V));
  const int64_t precision0 = first.data_ptr<int64_t>()[V];
  if (precision0 != static_cast<int64_t>(options.precision))
    throw ConfigError(detail::concat("pipeline: rank ", self, " runs precision ", precision_name(options.precision),
                                     " but rank 0 runs ",
                                     precision0 >= 0 && precision0 <= 2 ? precision_name(static_cast<Precision>(precision0))
                                                                        : "an unknown precision"));
  partitioner::Balance chosen(first.data_ptr<int64_t>(), first.data_ptr<int64_t>() + V);
  partitioner::check(chosen, layers, V, "pipeline: rank 0's balance");
  balance = chosen;
}

void Executor::check_delivery(const schedule::Schedule& s) const {
  if (!options.transport.in_order) return;
  try {
    schedule::validate_in_order(s);
  } catch (const ScheduleError& e) {
    throw ConfigError(detail::concat("pipeline: a transport that delivers in order cannot run this schedule: ", e.what()));
  }
}

void Executor::check_usable() const {
  if (self >= 0 && !group.failure().empty())
    throw Error(detail::concat("pipeline: rank ", self, " cannot continue after an earlier failure: ", group.failure()));
}

// Multi-process: a failure on this rank or a peer's ends the pipeline. Aborting the control
// plane aborts the endpoint, which tells every peer at once, so none waits for its deadline.
void Executor::stop(const std::string& what) {
  if (self >= 0) group.abort(what);
}

void Executor::fail(const std::string& what, std::exception_ptr error) {
  stop(what);
  std::rethrow_exception(error);
}

int Executor::run_lists(const schedule::Schedule& lists, Pass pass, int64_t tag_step, Clock::time_point t0,
                        std::vector<std::exception_ptr>& errors) {
  fork_join(
      workers, local,
      [&](int r) {
        try {
          try {
            DeviceRunner(*this, r, lists, pass, tag_step, t0).run();
          } catch (const ReductionError& e) {
            const std::string cause = abort_notice(r);
            if (cause.empty()) throw;
            throw ReductionError(e.peer(), detail::concat(e.what(), "; meanwhile ", cause));
          }
        } catch (const std::exception& e) {
          int none = -1;
          first_failure.compare_exchange_strong(none, r);  // before the abort wakes the peers
          transports[r]->abort(detail::concat("stage ", r, " failed: ", e.what()));
          throw;
        }
      },
      nullptr, &errors);
  return first_failure.exchange(-1);
}

// Multi-process: every rank of the world sends its losses, peaks and spans; a rank reads its own
// copy's stages, and the losses of every copy's last stage.
void Executor::exchange_step_results(int M) {
  // Every rank of the world takes part; a rank reads its own copy's stages, and the losses
  // of every copy's last stage.
  const StepResult mine{losses, trace.peak_in_flight[self], trace.peak_awaiting_weight[self], trace.spans[self]};
  const auto all = group.all_gather(torch::tensor(encode_step_result(mine), torch::kDouble), "the step's losses");
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
  world_loss = 0;
  for (int c = 0; c < mesh.data_parallel; ++c) {  // every copy's last stage, in copy order
    double copy_loss = 0;  // each copy's sum first, then the copies in order: as in-process
    for (double l : result_of(mesh.rank(last_device(), c)).losses) copy_loss += l;
    world_loss += copy_loss;
  }
  for (int d = 0; d < options.stages; ++d) {
    const StepResult& r = result_of(peer(d));
    if (d == last_device()) losses = r.losses;
    if (d == self) continue;
    trace.peak_in_flight[d] = r.peak_in_flight;
    trace.peak_awaiting_weight[d] = r.peak_awaiting_weight;
    trace.spans[d] = r.spans;
  }
}

double Executor::run_step(const at::Tensor& input, const at::Tensor& target, bool apply_optimizer,
                                bool accumulate, double scale) {
  check_usable();
  const int64_t N = input.size(0);
  if (target.size(0) != N)
    throw ConfigError(detail::concat("pipeline: ", N, " inputs but ", target.size(0), " targets"));
  if (N < mesh.data_parallel)
    throw ConfigError(detail::concat("pipeline: a batch of ", N, " sample", N == 1 ? "" : "s", " cannot be shared by ",
                                     mesh.data_parallel, " copies"));
  // A batch smaller than the micro-batch count (an epoch's last) runs as fewer micro-batches:
  // every copy decides alike, from the smallest shard (N / D samples).
  sched = schedule_for(static_cast<int>(std::min<int64_t>(configured.micro_batches, N / mesh.data_parallel)));
  const int M = sched.micro_batches;
  fewest = accumulate ? std::min(fewest, M) : M;
  // Data parallelism: this copy's shard of the batch, and where it starts (the dropout streams
  // follow the sample's place in the whole batch).
  at::Tensor shard_input = input, shard_target = target;
  int64_t first_sample = 0;
  if (mesh.data_parallel > 1) {
    const auto in = input.tensor_split(mesh.data_parallel, 0), tg = target.tensor_split(mesh.data_parallel, 0);
    for (int d = 0; d < copy; ++d) first_sample += in[d].size(0);
    shard_input = in[copy];
    shard_target = tg[copy];
  }
  inputs = shard_input.tensor_split(M, 0);
  targets = shard_target.tensor_split(M, 0);
  // fp16: the loss is scaled before backward (every rank holds the same scale).
  const double loss_scale = scaling() ? opt.scaler.scale() : 1.0;
  offsets.assign(M, 0);
  weights.assign(M, 0);
  losses.assign(M, 0);
  loss_values.assign(M, at::Tensor());
  for (int m = 0; m < M; ++m) {
    offsets[m] = m ? offsets[m - 1] + inputs[m - 1].size(0) : first_sample;
    weights[m] = scale * loss_scale * static_cast<double>(inputs[m].size(0)) / static_cast<double>(N);
  }
  accumulate_grads = accumulate;
  grads_reduced = mesh.data_parallel == 1 || sync;
  for (auto& reducer : reducers)
    if (reducer) reducer->begin_step(accumulate);

  const auto t0 = Clock::now();
  step_t0 = t0;
  trace.step = step;
  trace.start = std::chrono::duration<double>(t0 - created).count();
  std::vector<std::exception_ptr> errors;
  const int failed = run_lists(sched, Pass::Train, step, t0, errors);
  inputs.clear();
  targets.clear();
  loss_values.clear();
  {
    std::lock_guard<std::mutex> lock(marks_mu);
    marks.clear();  // a failed step's marks that were never received
  }
  for (auto& o : trace.optimizer) o = {0.0, 0.0};
  if (self >= 0) {
    // Multi-process: the exchange of the last stage's losses also tells every rank that every
    // other finished its list; a failure anywhere ends the pipeline on every rank.
    // Each rank also sends what it measured (peaks and spans), so that rank 0's trace and
    // metrics cover every stage, as in one process. Times are from each rank's own step start.
    if (failed >= 0) fail(detail::concat("step ", step, " failed"), errors[failed]);
    exchange_step_results(M);
  }
  // BatchNorm statistics: every micro-batch of a step that succeeded everywhere is folded in at
  // once (before any optimizer step); a failed step changes none.
  if (failed < 0 && mesh.data_parallel > 1) merge_batch_norm();  // over the whole batch, as one device sees it
  for (int vs = 0; vs < static_cast<int>(stages.size()); ++vs) {
    if (!runs(vs)) continue;  // another rank's
    if (failed >= 0)
      models::reset_batch_norm(*stages[vs]->layers());
    else
      models::commit_batch_norm(*stages[vs]->layers());
  }
  if (failed >= 0) {
    trace.wall = seconds_since(t0);
    transports = stage_transports(options);  // fresh mailboxes
    ++step;
    std::rethrow_exception(errors[failed]);
  }
  // The optimizers step only once every stage has finished its list, so a failed step leaves
  // every parameter as it was. Each steps in its own worker (its intra-op thread setting).
  if (apply_optimizer) {
    try {
      opt.grad_norm = step_all(*this, t0);
    } catch (...) {
      trace.wall = seconds_since(t0);
      ++step;
      throw;
    }
  }
  trace.wall = seconds_since(t0);
  ++step;
  double loss = 0;
  for (double l : losses) loss += l;
  if (self >= 0 && mesh.data_parallel > 1) loss = world_loss;
  return loss / loss_scale;
}

// A forward-only pass: the batch is split into the configured micro-batches, which flow through
// the stages on schedule::forward_only's lists (each device takes them in order, so none waits
// on a later one), with no gradients, no recomputation and the layers in evaluation mode.
at::Tensor Executor::evaluate(const at::Tensor& input) {
  check_usable();
  const int M = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(options.micro_batches, input.size(0))));
  const schedule::Schedule lists = schedule::forward_only(configured, M);
  inputs = input.tensor_split(M, 0);
  outputs.assign(M, at::Tensor());
  const int64_t tag_step = -(++predictions);  // never a training step's
  model->eval();
  std::vector<std::exception_ptr> errors;
  const int failed = run_lists(lists, Pass::Evaluate, tag_step, Clock::now(), errors);
  model->train();
  inputs.clear();
  std::vector<at::Tensor> out = std::move(outputs);
  outputs.clear();
  if (failed >= 0) {
    if (self >= 0) fail("evaluation failed", errors[failed]);
    transports = stage_transports(options);  // fresh mailboxes
    std::rethrow_exception(errors[failed]);
  }
  if (!is_local_device(last_device())) return at::Tensor();
  return M == 1 ? out[0] : torch::cat(out, 0);
}

}  // namespace pipetrain::pipeline
