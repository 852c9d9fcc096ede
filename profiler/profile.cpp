#include "profiler/profile.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>

#include <ATen/Parallel.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/error.h"
#include "common/memory_account.h"
#include "common/json_reader.h"
#include "common/strings.h"
#include "common/stats.h"
#include "models/weight_grads.h"
#include "stages/device.h"

namespace pipetrain::profiler {

using partitioner::LayerCost;

namespace {

// Replaces the CPU allocator: memory comes from c10::alloc_cpu as before. While counting is on,
// each allocation's size is recorded by address (with the counter's generation), added to
// `live` and subtracted when freed; allocations made while counting is off get c10's plain
// deleter and cost nothing more. The context of every DataPtr is its data pointer, as
// raw_allocate() requires.
class CountingAllocator final : public c10::Allocator {
 public:
  std::atomic<bool> on{false};

  c10::DataPtr allocate(size_t n) override {
    void* data = c10::alloc_cpu(n);
    if (!on.load(std::memory_order_relaxed)) return {data, data, &c10::free_cpu, c10::Device(c10::DeviceType::CPU)};
    self().count(data, n);
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  // raw_deallocate() frees everything through this one, counted or not.
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  void start() {
    std::lock_guard<std::mutex> lock(mu_);
    ++generation_;  // allocations of earlier counters no longer count when freed
    live_ = peak_ = 0;
    account_live_.fill(0);
    account_peak_.fill(0);
  }
  int64_t live() {
    std::lock_guard<std::mutex> lock(mu_);
    return live_;
  }
  int64_t peak() {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_;
  }
  int64_t peak(int account) {
    std::lock_guard<std::mutex> lock(mu_);
    return account_peak_[slot(account)];
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    peak_ = live_;
    account_peak_ = account_live_;
  }

  static constexpr int kAccounts = 256;

 private:
  static CountingAllocator& self();
  // Accounts 0..kAccounts-2 have their own slot; the rest (and -1) share the last one.
  static size_t slot(int account) {
    return account >= 0 && account < kAccounts - 1 ? static_cast<size_t>(account) : kAccounts - 1;
  }
  void count(void* data, size_t n) {
    const size_t a = slot(memory_account());
    std::lock_guard<std::mutex> lock(mu_);
    sizes_[data] = {n, generation_, a};
    live_ += static_cast<int64_t>(n);
    peak_ = std::max(peak_, live_);
    account_live_[a] += static_cast<int64_t>(n);
    account_peak_[a] = std::max(account_peak_[a], account_live_[a]);
  }
  static void release(void* data) {
    CountingAllocator& a = self();
    {
      std::lock_guard<std::mutex> lock(a.mu_);
      auto it = a.sizes_.find(data);
      if (it != a.sizes_.end()) {
        if (it->second.generation == a.generation_) {
          a.live_ -= static_cast<int64_t>(it->second.bytes);
          a.account_live_[it->second.account] -= static_cast<int64_t>(it->second.bytes);
        }
        a.sizes_.erase(it);
      }
    }
    c10::free_cpu(data);
  }
  struct Allocation {
    size_t bytes;
    uint64_t generation;
    size_t account;  // the allocating thread's slot: a tensor freed elsewhere still leaves its owner
  };
  std::mutex mu_;
  std::unordered_map<void*, Allocation> sizes_;
  uint64_t generation_ = 0;
  int64_t live_ = 0, peak_ = 0;
  std::array<int64_t, kAccounts> account_live_{}, account_peak_{};
};

CountingAllocator& counting() {
  static CountingAllocator* instance = [] {
    auto* a = new CountingAllocator();  // lives as long as the process
    c10::SetCPUAllocator(a, /*priority=*/100);
    return a;
  }();
  return *instance;
}
CountingAllocator& CountingAllocator::self() { return counting(); }

std::mutex counter_mu;  // one MemoryCounter at a time

double host_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Times operations in a device context: the host's clock on the CPU; on a GPU stamps around
// each operation, read when flush() synchronizes once (a repetition), so the host runs ahead as
// in a stage.
class Timer {
 public:
  explicit Timer(stages::DeviceContext& ctx) : ctx_(ctx) {}
  stages::Stamp begin() { return ctx_.stamp(host_s()); }
  void end(const stages::Stamp& began, std::vector<double>* into) {
    pending_.push_back({into, began, ctx_.stamp(host_s())});
  }
  void flush() {
    if (pending_.empty()) return;
    ctx_.synchronize();
    for (const Pending& p : pending_)
      p.into->push_back(1000.0 * (stages::DeviceContext::resolve(p.began, p.ended) - p.began.host_s));
    pending_.clear();
  }

 private:
  struct Pending {
    std::vector<double>* into;
    stages::Stamp began, ended;
  };
  stages::DeviceContext& ctx_;
  std::vector<Pending> pending_;
};

// What a layer's work allocates from construction on: the counting CPU allocator on the CPU,
// the device allocator's statistics on a GPU.
class Bytes {
 public:
  explicit Bytes(stages::DeviceContext& ctx) : ctx_(ctx) {
    if (ctx.device().is_cpu()) {
      counter_.emplace();
    } else {
      base_ = ctx.allocated_bytes();
      ctx.reset_peak();
    }
  }
  int64_t live() const { return counter_ ? counter_->live() : ctx_.allocated_bytes() - base_; }
  int64_t peak() const { return counter_ ? counter_->peak() : ctx_.peak_bytes() - base_; }
  void reset_peak() {
    if (counter_)
      counter_->reset_peak();
    else
      ctx_.reset_peak();
  }

 private:
  stages::DeviceContext& ctx_;
  std::optional<MemoryCounter> counter_;
  int64_t base_ = 0;
};

}  // namespace

MemoryCounter::MemoryCounter() {
  counter_mu.lock();
  counting().start();
  counting().on = true;
}
MemoryCounter::~MemoryCounter() {
  counting().on = false;
  counter_mu.unlock();
}
int64_t MemoryCounter::live() const { return counting().live(); }
int64_t MemoryCounter::peak() const { return counting().peak(); }
int64_t MemoryCounter::peak(int account) const { return counting().peak(account); }
void MemoryCounter::reset_peak() { counting().reset_peak(); }

Profile profile_layers(torch::nn::Sequential model, const at::Tensor& input_in, const at::Tensor& target_in,
                       const stages::LossFn& loss, const ProfileOptions& o) {
  PIPETRAIN_CHECK(o.repeat >= 1 && o.warmup >= 0, "profile: bad repeat/warmup");
  const std::unique_ptr<stages::DeviceContext> ctx = stages::make_device_context(o.device);
  const auto scope = ctx->enter();
  model->to(o.device);
  const at::Tensor input = input_in.to(o.device), target = target_in.to(o.device);
  Timer timer(*ctx);
  const int threads = at::get_num_threads();
  at::set_num_threads(std::max(1, o.intra_op_threads));
  Profile p;
  p.input_bytes = static_cast<int64_t>(input.nbytes());
  p.micro_batch = input.dim() > 0 ? input.size(0) : 1;
  const int L = static_cast<int>(model->size());
  auto children = model->named_children();
  // Each layer is a stage of its own: a stage in the middle of three gets an input gradient and
  // an output gradient; the last layer is the last stage and ends in the loss. The layers run as
  // a chain, every forward in order then every backward in reverse, as in a stage of many: timed
  // alone and over and over, a layer would find its weights in the cache, which a stage that
  // runs other layers in between does not.
  struct Layer {
    std::unique_ptr<stages::Stage> stage;
    torch::nn::Sequential one;
    at::Tensor grad;          // the output gradient its backward gets (random: times do not depend on values)
    stages::Skips skip_grads;  // and those of the skips open after it
    std::vector<double> fwd, bwd, bin, bw, bdef, flush;
    int64_t awaiting = 0, stashed = 0;
    models::WeightGradStash stash;  // the deferred pass's
  };
  std::vector<Layer> layers(L);
  for (int i = 0; i < L; ++i) {
    Layer& l = layers[i];
    l.one->push_back(children[i].key(), *(model->begin() + i));
    const bool first = i == 0, last = i == L - 1;
    l.stage = std::make_unique<stages::Stage>(first ? 0 : 1, last ? (first ? 1 : 2) : 3, l.one, Recompute::Never);
    if (last) l.stage->set_loss(loss);
    l.stage->set_precision(o.precision);
    LayerCost c;
    c.name = children[i].key();
    c.trainable_bytes = 0;
    for (const auto& param : l.one->parameters()) {
      c.param_bytes += static_cast<int64_t>(param.nbytes());
      if (param.requires_grad()) c.trainable_bytes += static_cast<int64_t>(param.nbytes());
    }
    p.layers.push_back(c);
    l.stash = models::WeightGradStash(o.defer_min_bytes);
  }
  // A third pass with deferred weight gradients, where a weight is large enough to be deferred
  // (the stash takes float32 gradients on the CPU only: models/linear.cpp).
  bool deferring = false;
  if (o.defer_min_bytes >= 0 && o.device.is_cpu() && o.precision == Precision::FP32)
    for (const auto& param : model->parameters())
      deferring = deferring || static_cast<int64_t>(param.nbytes()) >= o.defer_min_bytes;
  // One forward of every layer in order: the outputs and the skips open after each layer.
  std::vector<at::Tensor> outs(L);
  std::vector<stages::Skips> open(L);
  auto input_of = [&](int i) { return i == 0 ? input : outs[i - 1].detach(); };
  auto skips_of = [&](int i) { return i == 0 ? stages::Skips{} : open[i - 1]; };
  auto forward_all = [&](bool timed) {
    for (int i = 0; i < L; ++i) {
      Layer& l = layers[i];
      const bool last = i == L - 1;
      const stages::Stamp t0 = timer.begin();
      outs[i] = l.stage->forward(0, input_of(i), 0, last ? target : at::Tensor(), 1.0, skips_of(i), &open[i]);
      if (timed) timer.end(t0, &l.fwd);
      if (!last && !l.grad.defined()) l.grad = torch::randn_like(outs[i]);
      for (const auto& [name, t] : open[i])
        if (!l.skip_grads.count(name)) l.skip_grads[name] = torch::randn_like(t);
    }
  };
  try {
    for (int rep = 0; rep < o.warmup + o.repeat; ++rep) {
      const bool timed = rep >= o.warmup;
      for (int split = 0; split < (deferring ? 3 : 2); ++split) {
        for (auto& l : layers) l.stage->begin_step(0, rep, 1);
        forward_all(timed && split == 0);
        for (int i = L - 1; i >= 0; --i) {
          Layer& l = layers[i];
          stages::Stamp t0 = timer.begin();
          if (split == 0) {
            l.stage->backward(0, l.grad, l.skip_grads);
            if (timed) timer.end(t0, &l.bwd);
            continue;
          }
          if (split == 2) {
            {
              models::DeferWeightGrads deferred(&l.stash);
              l.stage->backward(0, l.grad, l.skip_grads);
            }
            if (timed) timer.end(t0, &l.bdef);
            l.stashed = l.stash.bytes();
            t0 = timer.begin();
            l.stash.flush();
            if (timed) timer.end(t0, &l.flush);
            continue;
          }
          l.stage->backward_input(0, l.grad, l.skip_grads);
          if (timed) timer.end(t0, &l.bin);
          t0 = timer.begin();
          l.stage->backward_weight(0);
          if (timed) timer.end(t0, &l.bw);
        }
        timer.flush();
      }
    }
    // Memory, layer by layer (it does not depend on what the cache holds), with the gradients of
    // the repetitions above in place.
    for (int i = 0; i < L; ++i) {
      Layer& l = layers[i];
      LayerCost& c = p.layers[i];
      const bool last = i == L - 1;
      const at::Tensor tgt = last ? target : at::Tensor();
      stages::Skips left;
      l.stage->begin_step(0, o.warmup + o.repeat, 1);
      if (o.precision != Precision::FP32) {
        // A reduced precision: autocast's copy of a weight is made by the step's first forward
        // and shared by every micro-batch (the memory model counts it once, with the
        // parameters); it must not count as what this micro-batch keeps for backward.
        l.stage->forward(0, input_of(i), 0, tgt, 1.0, skips_of(i), &left);
        l.stage->backward(0, l.grad, l.skip_grads);
      }
      {
        Bytes counter(*ctx);
        l.stage->forward(0, input_of(i), 0, tgt, 1.0, skips_of(i), &left);
        // Kept: what the graph holds after the forward; workspace: what the forward needed above
        // that at its peak, then what the backward needs above its start (the gradients from
        // earlier repetitions exist, so the new weight gradients are the transient copies a
        // micro-batch after the first accumulates from).
        c.saved_bytes = counter.live();
        c.workspace_bytes = std::max<int64_t>(0, counter.peak() - counter.live());
        counter.reset_peak();
        const int64_t start = counter.live();
        l.stage->backward(0, l.grad, l.skip_grads);
        c.workspace_bytes = std::max(c.workspace_bytes, counter.peak() - start);
      }
      l.stage->forward(0, input_of(i), 0, tgt, 1.0, skips_of(i), &left);
      {
        Bytes held(*ctx);  // what B leaves for W
        l.stage->backward_input(0, l.grad, l.skip_grads);
        l.awaiting = std::max<int64_t>(0, held.live());
      }
      l.stage->backward_weight(0);
    }
  } catch (...) {
    at::set_num_threads(threads);
    throw;
  }
  for (int i = 0; i < L; ++i) {
    Layer& l = layers[i];
    LayerCost& c = p.layers[i];
    c.forward_ms = median(l.fwd);
    c.backward_ms = median(l.bwd);
    // What crosses a cut after this layer: its output and the skips still open.
    c.activation_bytes = i == L - 1 ? 0 : static_cast<int64_t>(outs[i].nbytes());
    for (const auto& [name, t] : open[i]) c.activation_bytes += static_cast<int64_t>(t.nbytes());
    p.backward_input_ms.push_back(median(l.bin));
    p.backward_weight_ms.push_back(median(l.bw));
    p.awaiting_weight_bytes.push_back(l.awaiting);
    if (deferring) {
      p.deferred_backward_ms.push_back(median(l.bdef));
      p.flush_ms.push_back(median(l.flush));
      p.deferred_bytes.push_back(l.stashed);
    }
    for (auto& param : l.one->parameters()) param.mutable_grad() = at::Tensor();
  }
  at::set_num_threads(threads);
  return p;
}

void save_costs(const std::string& path, const Profile& p, const std::vector<partitioner::TieCost>& ties) {
  partitioner::CostFile file;
  file.layers = p.layers;
  file.ties = ties;
  for (size_t i = 0; i < p.layers.size(); ++i) {
    file.layers[i].backward_input_ms = p.backward_input_ms[i];
    file.layers[i].backward_weight_ms = p.backward_weight_ms[i];
  }
  file.micro_batch = p.micro_batch;
  file.input_bytes = p.input_bytes;
  std::ofstream out(path, std::ios::out | std::ios::trunc);
  if (!out) throw ConfigError(path + ": cannot open for writing");
  partitioner::write_cost_file(out, file);
  if (!out) throw Error(path + ": write failed");
}

}  // namespace pipetrain::profiler

namespace pipetrain::profiler {

double bf16_speed(int repeat) {
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const at::Tensor a = torch::randn({256, 512}, gen), b = torch::randn({512, 512}, gen);
  const at::Tensor a16 = a.to(torch::kBFloat16), b16 = b.to(torch::kBFloat16);
  auto time_of = [&](const at::Tensor& x, const at::Tensor& y) {
    std::vector<double> ms;
    at::mm(x, y);  // warm-up
    for (int i = 0; i < std::max(1, repeat); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      at::mm(x, y);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    return median(ms);
  };
  const double fp32 = time_of(a, b), bf16 = time_of(a16, b16);
  at::set_num_threads(threads);
  return bf16 > 0 ? fp32 / bf16 : 0;
}

}  // namespace pipetrain::profiler
