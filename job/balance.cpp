// Choosing the balance (job/balance.h).
#include "job/balance.h"

#include <algorithm>
#include <chrono>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "common/error.h"
#include "common/stats.h"
#include "pipeline/optimizer_state.h"
#include "schedule/simulate.h"
#include "stages/device.h"

namespace pipetrain::job {

namespace {

int virtual_stages(const Config& c) { return c.pipeline.stages * c.pipeline.chunks; }

// Peak in-flight micro-batches per device of the configured schedule (they do not depend on
// costs for these schedules), mapped to the virtual stages: each chunk is counted with its
// device's whole peak, an upper bound.
std::vector<int> in_flight(const Config& c) {
  const auto s = schedule::make_schedule(c.pipeline.schedule, c.pipeline.stages, c.pipeline.micro_batches,
                                         c.pipeline.chunks);
  const auto sim = schedule::simulate(s, schedule::Costs::uniform(s.virtual_stages(), 1, 1, 1));
  std::vector<int> out(s.virtual_stages());
  for (int v = 0; v < s.virtual_stages(); ++v) out[v] = std::max(1, sim.peak_awaiting_weight[s.device_of(v)]);
  return out;
}


}  // namespace

partitioner::Constraints constraints(const Config& c, const profiler::Profile* p) {
  partitioner::Constraints k;
  const int V = virtual_stages(c), K = c.pipeline.stages;
  if (!c.pipeline.speeds.empty() || !c.pipeline.memory_limit.empty()) {
    k.devices.resize(V);
    for (int v = 0; v < V; ++v) {
      if (!c.pipeline.speeds.empty()) k.devices[v].speed = c.pipeline.speeds[v % K];
      // A device's chunks share its memory.
      if (!c.pipeline.memory_limit.empty()) k.devices[v].memory_limit = c.pipeline.memory_limit[v % K] / c.pipeline.chunks;
    }
  }
  if (p) k.memory = memory_model(c, *p);
  return k;
}

profiler::Profile profile_job(const Job& job, int repeat, int64_t rows) {
  const Config& c = job.config;
  Batch b = to_model(job, job.data.train_batch(0, c.data.batch_size, c.train.seed));
  // A micro-batch of the first copy's shard (data parallelism), as its stages see it.
  const int D = c.pipeline.data_parallel;
  at::Tensor x = b.input.tensor_split(D, 0)[0].tensor_split(c.pipeline.micro_batches, 0)[0];
  at::Tensor y = b.target.tensor_split(D, 0)[0].tensor_split(c.pipeline.micro_batches, 0)[0];
  if (rows > 0) {
    PIPETRAIN_CHECK(rows <= b.input.size(0), "profile_job: ", rows, " rows of a batch of ", b.input.size(0));
    x = b.input.narrow(0, 0, rows), y = b.target.narrow(0, 0, rows);
  }
  profiler::ProfileOptions o;
  o.repeat = repeat;
  o.intra_op_threads = job.options.intra_op_threads;
  o.precision = job.options.precision;
  o.defer_min_bytes = job.options.defer_min_bytes;
  // On the device the first stage runs on (the stages of a job share a kind); the model goes back
  // to the CPU afterwards, where a job's model is built and its pipeline places it.
  if (!job.options.devices.empty()) o.device = job.options.devices[0];
  struct BackToCpu {
    torch::nn::Sequential model;
    ~BackToCpu() { model->to(at::kCPU); }
  } back{job.model.layers};
  profiler::Profile p = profiler::profile_layers(job.model.layers, x, y, mean_cross_entropy, o);
  const std::unique_ptr<stages::DeviceContext> ctx = stages::make_device_context(o.device);
  const auto scope = ctx->enter();
  // The optimizer step of each layer, on the layer's own parameters with zero gradients (its
  // cost depends on the sizes, not the values); the values are saved first and restored after,
  // also when a step throws, so profiling leaves the model as it was. The layers step one after
  // another, as a stage steps them, so no layer is timed with its state left in the cache.
  const auto factory = make_optimizer_factory(c.optimizer);
  const int threads = at::get_num_threads();
  at::set_num_threads(std::max(1, job.options.intra_op_threads));
  std::vector<std::vector<at::Tensor>> params, saved;
  for (const auto& layer : *job.model.layers) {
    params.push_back(layer.ptr()->parameters());
    saved.emplace_back();
    for (auto& t : params.back()) {
      saved.back().push_back(t.detach().clone());
      t.mutable_grad() = torch::zeros_like(t);
    }
  }
  auto restore = [&] {
    torch::NoGradGuard no_grad;
    for (size_t l = 0; l < params.size(); ++l)
      for (size_t i = 0; i < params[l].size(); ++i) {
        params[l][i].copy_(saved[l][i]);
        params[l][i].mutable_grad() = at::Tensor();
      }
  };
  std::vector<std::vector<double>> times(params.size());
  try {
    std::vector<std::unique_ptr<torch::optim::Optimizer>> opts;
    for (auto& ps : params) opts.push_back(ps.empty() ? nullptr : factory(ps));
    for (int i = 0; i < 1 + repeat; ++i)
      for (size_t l = 0; l < opts.size(); ++l) {
        if (!opts[l]) continue;
        const double h0 = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
        const stages::Stamp t0 = ctx->stamp(h0);
        opts[l]->step();
        const stages::Stamp t1 = ctx->stamp(std::chrono::duration<double>(Clock::now().time_since_epoch()).count());
        ctx->synchronize();
        if (i) times[l].push_back(1000.0 * (stages::DeviceContext::resolve(t0, t1) - h0));
      }
  } catch (...) {
    restore();
    at::set_num_threads(threads);
    throw;
  }
  restore();
  for (const auto& t : times) p.optimizer_ms.push_back(t.empty() ? 0.0 : median(t));
  at::set_num_threads(threads);
  return p;
}

double state_factor(const OptimizerConfig& optimizer, Precision precision, int data_parallel, bool sharded) {
  // Optimizer state: momentum buffer for SGD with momentum, two moments for Adam.
  double state = pipeline::state_tensors_per_parameter(optimizer.kind, optimizer.momentum);
  double f = 1.0;  // the gradient
  if (data_parallel > 1) {
    f += 1.0;  // the reduction's flat copy of the gradients, from a stage's Reduce to its end
    // Sharded: a copy holds the state of its slice, and that slice of the parameters as the
    // optimizer's own tensor.
    if (sharded) state = (state + 1.0) / data_parallel;
  }
  f += state;
  // A reduced precision also holds autocast's low-precision copy of every weight through the step.
  if (precision != Precision::FP32) f += precision_bytes(precision) / 4.0;
  return f;
}

partitioner::MemoryModel memory_model(const Config& c, const profiler::Profile& p) {
  partitioner::MemoryModel m;
  m.state_factor = state_factor(c.optimizer, c.train.precision, c.pipeline.data_parallel, c.train.shard_optimizer);
  m.in_flight = in_flight(c);
  m.recompute = c.pipeline.recompute;
  // `except_last` keeps the last micro-batch's graph, but only gpipe is sure to hold it at the
  // peak; the other schedules may peak with recomputed micro-batches only, plus one rebuilt
  // graph, which is what `always` predicts.
  if (m.recompute == Recompute::ExceptLast && c.pipeline.schedule != schedule::Kind::GPipe)
    m.recompute = Recompute::Always;
  m.input_bytes = p.input_bytes;
  return m;
}

partitioner::Balance balance_by(BalanceMethod method, const std::vector<partitioner::LayerCost>& layers, int V,
                                partitioner::Constraints k, const partitioner::Balance& list) {
  const int n = static_cast<int>(layers.size());
  if (method == BalanceMethod::List) return list;
  if (method == BalanceMethod::Uniform) return partitioner::uniform(n, V);
  if (method == BalanceMethod::Parameters) {
    std::vector<double> w;
    for (const auto& l : layers) w.push_back(static_cast<double>(l.param_bytes));
    return partitioner::by_weights(w, V);
  }
  if (method == BalanceMethod::Time) return partitioner::min_max(layers, V, k).balance;
  PIPETRAIN_CHECK(method == BalanceMethod::Memory, "balance method '", choice_name(method), "' has no rule");
  // The same exact min-max, on each layer's share of a stage's peak bytes instead of time.
  std::vector<partitioner::LayerCost> mem = layers;
  const auto& m = k.memory;
  const int peak = m.in_flight.empty() ? 1 : *std::max_element(m.in_flight.begin(), m.in_flight.end());
  for (auto& l : mem) {
    const bool keeps_all = m.recompute == Recompute::Never;
    l.forward_ms = static_cast<double>(l.param_bytes) + static_cast<double>(l.trained_bytes()) * m.state_factor +
                   static_cast<double>(l.saved_bytes) * (keeps_all ? peak : 1);
    l.backward_ms = 0;
  }
  for (auto& d : k.devices) d.speed = 1;  // speeds do not change memory
  return partitioner::min_max(mem, V, k).balance;
}

partitioner::Balance choose_balance(const Config& c, const torch::nn::Sequential& model,
                                    const profiler::Profile* profile) {
  const int layers = static_cast<int>(model->size()), V = virtual_stages(c);
  const BalanceMethod method = c.pipeline.balance_method;
  const std::string where = c.where("pipeline.balance");
  try {
    if (method == BalanceMethod::List) partitioner::check(c.pipeline.balance, layers, V, where);
    std::vector<partitioner::LayerCost> costs;
    if (profile) {
      costs = profile->layers;
    } else {  // the parameter bytes are all that a method without a profile reads
      PIPETRAIN_CHECK(method == BalanceMethod::List || method == BalanceMethod::Uniform || method == BalanceMethod::Parameters,
                      "balance method '", choice_name(method), "' needs a profile");
      for (const auto& m : *model) {
        partitioner::LayerCost l;
        l.trainable_bytes = 0;
        for (const auto& p : m.ptr()->parameters()) {
          l.param_bytes += static_cast<int64_t>(p.nbytes());
          if (p.requires_grad()) l.trainable_bytes += static_cast<int64_t>(p.nbytes());
        }
        costs.push_back(l);
      }
    }
    PIPETRAIN_CHECK(static_cast<int>(costs.size()) == layers, "the profile has ", costs.size(), " layers but the model ", layers);
    return balance_by(method, costs, V, constraints(c, profile), c.pipeline.balance);
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    if (msg.rfind(where, 0) == 0) throw;
    throw ConfigError(where + ": " + msg);
  }
}

partitioner::Balance resolve_balance(const Job& job) {
  const Config& c = job.config;
  const bool needs_profile =
      c.pipeline.balance_method == BalanceMethod::Time || c.pipeline.balance_method == BalanceMethod::Memory;
  profiler::Profile profile;
  if (needs_profile) profile = profile_job(job);
  return choose_balance(c, job.model.layers, needs_profile ? &profile : nullptr);
}

Job prepare_balanced(const Config& config) {
  Job job = prepare(config);
  job.options.balance = resolve_balance(job);
  return job;
}

}  // namespace pipetrain::job
