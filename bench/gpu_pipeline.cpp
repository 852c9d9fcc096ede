// A GPT of real size on one GPU: the plain single-device loop against the same model as a
// pipeline of 1, 2 and 4 stages sharing that GPU (the overhead of pipelining where the
// schedule cannot hide anything), its peak memory per recomputation mode, and the largest batch
// that fits with and without recomputation. Writes one JSON line per measurement.
//
//   gpu_pipeline OUT.jsonl [--layers 24] [--d-model 1024] [--seq 1024] [--batch 16] [--steps 10]
//   gpu_pipeline OUT.jsonl --speed 1   (speed.jsonl: the small GPT with and without CUDA graphs,
//                                       the 24-layer GPT in 4 stages, peaks, largest batches;
//                                       --small 0 and --largest 0 leave out the first and last)
//
// bf16 autocast over float32 master weights, SGD, no dropout. Rounds alternate the variants; each
// reports the median and the range of its steps' samples/s. Needs a CUDA device.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/error.h"
#include "common/json_reader.h"
#include "models/model.h"
#include "pipeline/pipeline.h"
#include "stages/autocast.h"
#include "stages/device.h"

using namespace pipetrain;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string out;
  int64_t layers = 24, d_model = 1024, seq = 1024, batch = 16, vocab = 32000;
  int steps = 10, rounds = 2;
  bool speed = false;
  bool small = true, largest = true;  // --speed: the small GPT's case, the largest batches
};

at::Tensor mean_ce(const at::Tensor& out, const at::Tensor& target) {
  return torch::nn::functional::cross_entropy(out.reshape({-1, out.size(-1)}).to(torch::kFloat), target.reshape({-1}));
}

models::Model build(const Args& a) {
  json cfg{{"family", "gpt"}, {"vocab_size", a.vocab}, {"seq_len", a.seq}, {"d_model", a.d_model},
           {"n_heads", a.d_model / 64}, {"n_layers", a.layers}, {"d_ff", 4 * a.d_model}, {"dropout", 0.0}};
  JsonReader r(cfg, "model", "gpu_pipeline");
  return models::build(r, 1);
}

// The GPU's allocator peak, through the device context that reports it for the stages.
stages::DeviceContext& gpu_context() {
  static const auto ctx = stages::make_device_context(c10::Device(c10::kCUDA, 0));
  return *ctx;
}
int64_t peak() { return gpu_context().peak_bytes(); }
void reset_peak() { gpu_context().reset_peak(); }

struct Variant {
  std::string name;  // "plain" or "pipeline"
  int stages = 1, micro_batches = 8;
  schedule::Kind schedule = schedule::Kind::OneFOneB;
  Recompute recompute = Recompute::Never;
  bool graphs = false;  // pipeline.cuda_graphs
};

// Runs `steps` steps of one variant and returns each step's seconds (the device finished).
std::vector<double> run(const Variant& v, torch::nn::Sequential model, const at::Tensor& x, const at::Tensor& y,
                        int steps, int warmup) {
  std::vector<double> times;
  const c10::Device gpu(c10::kCUDA, 0);
  if (v.name == "plain" || v.name == "accumulate") {
    // The plain loop: the whole batch at once, or (accumulate) the pipeline's micro-batches one
    // after another, their gradients summed, which separates the cost of smaller products from
    // the executor's.
    model->to(gpu);
    torch::optim::SGD opt(model->parameters(), 1e-4);
    const at::Tensor xg = x.to(gpu), yg = y.to(gpu);
    const int parts = v.name == "plain" ? 1 : v.micro_batches;
    const auto xs = xg.tensor_split(parts, 0), ys = yg.tensor_split(parts, 0);
    for (int i = 0; i < warmup + steps; ++i) {
      const auto t0 = Clock::now();
      opt.zero_grad();
      for (int k = 0; k < parts; ++k) {
        at::Tensor loss;
        {
          stages::AutocastGuard autocast(Precision::BF16, torch::kCUDA);
          loss = mean_ce(model->forward(xs[k]), ys[k]) * (static_cast<double>(xs[k].size(0)) / x.size(0));
        }
        loss.backward();
      }
      opt.step();
      stages::clear_autocast_cache();
      c10::cuda::device_synchronize();
      if (i >= warmup) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return times;
  }
  pipeline::PipelineOptions o;
  o.stages = v.stages;
  o.micro_batches = v.micro_batches;
  o.schedule = v.schedule;
  o.recompute = v.recompute;
  o.precision = Precision::BF16;
  o.devices = {gpu};
  o.timeout_s = 600;
  o.cuda_graphs = v.graphs;
  pipeline::Pipeline pipe(model, o, mean_ce);
  pipe.optimizers().set([](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, 1e-4); });
  for (int i = 0; i < warmup + steps; ++i) {
    const auto t0 = Clock::now();
    pipe.train_step(x, y);  // returns once every stage's stream is done
    if (i >= warmup) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return times;
}

std::string describe(const Variant& v) {
  if (v.name == "plain") return "plain";
  if (v.name == "accumulate") return pipetrain::detail::concat("plain, ", v.micro_batches, " accumulated micro-batches");
  return pipetrain::detail::concat("pipeline ", v.stages, " stage", v.stages == 1 ? "" : "s", " ", schedule::name(v.schedule), " M=",
                        v.micro_batches, " recompute=", recompute_name(v.recompute), v.graphs ? " cuda_graphs" : "");
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Alternating rounds of `variants` on one model and batch; one JSON line per variant, with its
// speed against the first variant (the plain loop) of the same rounds.
void compare(const std::vector<Variant>& variants, torch::nn::Sequential model, const at::Tensor& x, const at::Tensor& y,
             const Args& a, const json& common, const std::string& measure, std::ostream& out) {
  std::map<std::string, std::vector<double>> times;
  std::map<std::string, int64_t> peaks;
  // A variant that fails is reported with its error and left out of the later rounds; the others
  // still run. Out of memory is the likely one: a stage's graphs hold every micro-batch's memory
  // pool for the whole run (its activations, as GPipe keeps them, and its own gradients), which
  // for the 24-layer GPT in 4 stages is GPipe's 60 GB and more.
  std::map<std::string, std::string> failed;
  for (int round = 0; round < a.rounds; ++round)
    for (const Variant& v : variants) {
      if (failed.count(describe(v))) continue;
      reset_peak();
      std::vector<double> t;
      try {
        t = run(v, model, x, y, a.steps, round == 0 ? 3 : v.graphs ? 2 : 1);  // a graphed run captures in its step 2
      } catch (const std::exception& e) {
        const std::string what = e.what();
        failed[describe(v)] = what.substr(0, std::min(what.find('\n'), size_t{300}));
        std::cerr << measure << " round " << round << " " << describe(v) << ": failed: " << failed[describe(v)] << "\n";
        c10::cuda::CUDACachingAllocator::emptyCache();
        continue;
      }
      peaks[describe(v)] = std::max(peaks[describe(v)], peak());
      c10::cuda::CUDACachingAllocator::emptyCache();  // each variant starts from a bare allocator
      auto& all = times[describe(v)];
      all.insert(all.end(), t.begin(), t.end());
      std::cerr << measure << " round " << round << " " << describe(v) << ": " << x.size(0) / median_of(t) << " samples/s\n";
    }
  const auto& plain = times[describe(variants.front())];
  const double first = plain.empty() ? 0 : x.size(0) / median_of(plain);
  for (const Variant& v : variants) {
    auto t = times[describe(v)];
    std::sort(t.begin(), t.end());
    json j = common;
    j["measure"] = measure;
    j["variant"] = describe(v);
    if (t.empty()) {
      j["error"] = failed[describe(v)];
      out << j.dump() << "\n";
      out.flush();
      std::cout << j.dump() << "\n";
      continue;
    }
    j["samples_per_s"] = x.size(0) / median_of(t);
    j["samples_per_s_min"] = x.size(0) / t.back();
    j["samples_per_s_max"] = x.size(0) / t.front();
    j["steps"] = t.size();
    if (first > 0) j["vs_plain"] = x.size(0) / median_of(t) / first;
    j["peak_bytes"] = peaks[describe(v)];
    out << j.dump() << "\n";
    out.flush();
    std::cout << j.dump() << "\n";
  }
}

// The fields every line of the speed run carries.
json speed_common(const Args& a, const std::string& card, const std::string& name) {
  return {{"bench", "gpu_speed"}, {"device", card}, {"model", name}, {"layers", a.layers},
          {"d_model", a.d_model}, {"seq", a.seq}, {"batch", a.batch}, {"precision", "bf16"}};
}

// One model of the speed run: the plain loop, and `stages` stages of 1F1B over `micro_batches`
// eager and with CUDA graphs, then `more` (variants that tell where the time goes), alternating
// (compare); returns the model for what follows.
models::Model speed_case(const Args& a, int stages, int micro_batches, const std::string& card, const std::string& name,
                         std::ostream& out, const std::vector<Variant>& more = {}) {
  models::Model m = build(a);
  torch::manual_seed(0);
  const at::Tensor x = torch::randint(0, a.vocab, {a.batch, a.seq}, torch::kLong);
  const at::Tensor y = torch::randint(0, a.vocab, {a.batch, a.seq}, torch::kLong);
  const json common = speed_common(a, card, name);
  std::vector<Variant> variants{{"plain"},
                                {"pipeline", stages, micro_batches, schedule::Kind::OneFOneB, Recompute::Never, false},
                                {"pipeline", stages, micro_batches, schedule::Kind::OneFOneB, Recompute::Never, true}};
  variants.insert(variants.end(), more.begin(), more.end());
  compare(variants, m.layers, x, y, a, common, name, out);
  return m;
}

// The largest batch that fits (doubling, one step each, 2 samples per micro-batch, GPipe on
// one stage): without recomputation and with it for every micro-batch.
void largest_batches(torch::nn::Sequential model, const Args& a, const json& common, std::ostream& out) {
  for (Recompute mode : {Recompute::Never, Recompute::Always}) {
    int64_t fits = 0;
    for (int64_t b = a.batch; b <= 512; b *= 2) {
      const at::Tensor xb = torch::randint(0, a.vocab, {b, a.seq}, torch::kLong);
      const at::Tensor yb = torch::randint(0, a.vocab, {b, a.seq}, torch::kLong);
      Variant v{"pipeline", 1, static_cast<int>(b / 2), schedule::Kind::GPipe, mode};
      try {
        run(v, model, xb, yb, 1, 0);
        fits = b;
      } catch (const std::exception& e) {
        std::cerr << "batch " << b << " " << recompute_name(mode) << ": " << std::string(e.what()).substr(0, 200) << "\n";
        break;
      }
      c10::cuda::CUDACachingAllocator::emptyCache();
    }
    c10::cuda::CUDACachingAllocator::emptyCache();
    json j = common;
    j["measure"] = "largest_batch";
    j["searched_up_to"] = 512;
    j["recompute"] = recompute_name(mode);
    j["largest_batch"] = fits;
    out << j.dump() << "\n";
    out.flush();
    std::cout << j.dump() << "\n";
}
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (argc < 2) {
    std::cerr << "usage: gpu_pipeline OUT.jsonl [--layers N] [--d-model N] [--seq N] [--batch N] [--steps N]\n";
    return 2;
  }
  a.out = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int64_t v = std::atoll(argv[i + 1]);
    if (k == "--layers") a.layers = v;
    else if (k == "--d-model") a.d_model = v;
    else if (k == "--seq") a.seq = v;
    else if (k == "--batch") a.batch = v;
    else if (k == "--steps") a.steps = static_cast<int>(v);
    else if (k == "--rounds") a.rounds = static_cast<int>(v);
    else if (k == "--speed") a.speed = v != 0;
    else if (k == "--small") a.small = v != 0;
    else if (k == "--largest") a.largest = v != 0;
    else {
      std::cerr << "gpu_pipeline: unknown option " << k << "\n";
      return 2;
    }
  }
  if (!torch::cuda::is_available()) {
    std::cerr << "gpu_pipeline: no CUDA device\n";
    return 1;
  }
  at::globalContext().setAllowTF32CuBLAS(true);
  std::ofstream out(a.out, std::ios::app);
  const std::string card = c10::cuda::device_count() ? std::string(at::cuda::getDeviceProperties(0)->name) : "";
  if (a.speed) {
    // 1. The small GPT (configs/gpt_small.json's shape, no dropout): launch-bound, where graphs
    // pay; 2 stages. 2. The 24-layer GPT in 4 stages, with fused attention. Each as the plain
    // loop, the pipeline (1F1B) eager and the same with graphs, each with its peak memory.
    Args small = a;
    small.layers = 4, small.d_model = 64, small.seq = 32, small.batch = 32, small.vocab = 64, small.steps = 30;
    small.rounds = 3;
    if (a.small) speed_case(small, 2, 4, card, "gpt_small", out);
    Args big = a;
    big.steps = std::min(a.steps, 6);
    // Beside them, 4 stages over fewer, larger micro-batches (products 2 and 4 times as large),
    // with graphs and eagerly. (The plain loop over the 8 micro-batches one after another, 0.30x,
    // and one stage with graphs, 0.68x: bench/results/gpu/h200/speed_gpt24_variants.jsonl.)
    const models::Model bm =
        speed_case(big, 4, 8, card, "gpt24", out,
                   {{"pipeline", 4, 4, schedule::Kind::OneFOneB, Recompute::Never, true},
                    {"pipeline", 4, 2, schedule::Kind::OneFOneB, Recompute::Never, true},
                    {"pipeline", 4, 4, schedule::Kind::OneFOneB, Recompute::Never, false},
                    {"pipeline", 4, 2, schedule::Kind::OneFOneB, Recompute::Never, false}});
    // 3. The largest batch of the 24-layer GPT with and without recomputation.
    if (a.largest) largest_batches(bm.layers, big, speed_common(big, card, "gpt24"), out);
    return 0;
  }
  models::Model m = build(a);
  torch::manual_seed(0);
  const at::Tensor x = torch::randint(0, a.vocab, {a.batch, a.seq}, torch::kLong);
  const at::Tensor y = torch::randint(0, a.vocab, {a.batch, a.seq}, torch::kLong);
  const json common{{"bench", "gpu_pipeline"}, {"device", c10::cuda::device_count() ? std::string(at::cuda::getDeviceProperties(0)->name) : ""},
                    {"layers", a.layers}, {"d_model", a.d_model}, {"seq", a.seq}, {"batch", a.batch}, {"vocab", a.vocab},
                    {"precision", "bf16"}, {"optimizer", "sgd"}};

  // 1. Throughput: plain against 1, 2 and 4 stages (1F1B and GPipe, 8 micro-batches, no
  // recomputation), alternating rounds.
  std::vector<Variant> variants{{"plain"}, {"accumulate", 1, 8}};
  for (int k : {1, 2, 4}) variants.push_back({"pipeline", k, 8, schedule::Kind::OneFOneB, Recompute::Never});
  variants.push_back({"pipeline", 4, 8, schedule::Kind::GPipe, Recompute::Never});
  variants.push_back({"pipeline", 4, 8, schedule::Kind::OneFOneB, Recompute::ExceptLast});
  std::map<std::string, std::vector<double>> times;
  std::map<std::string, int64_t> peaks;
  for (int round = 0; round < a.rounds; ++round)
    for (const Variant& v : variants) {
      reset_peak();
      auto t = run(v, m.layers, x, y, a.steps, round == 0 ? 3 : 1);
      peaks[describe(v)] = std::max(peaks[describe(v)], peak());
      c10::cuda::CUDACachingAllocator::emptyCache();  // each variant starts from a bare allocator
      auto& all = times[describe(v)];
      all.insert(all.end(), t.begin(), t.end());
      std::cerr << "round " << round << " " << describe(v) << ": " << a.batch / t[t.size() / 2] << " samples/s\n";
    }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double plain = a.batch / median(times["plain"]);
  for (const Variant& v : variants) {
    auto t = times[describe(v)];
    std::sort(t.begin(), t.end());
    json j = common;
    j["measure"] = "throughput";
    j["variant"] = describe(v);
    j["stages"] = v.name == "pipeline" ? v.stages : 0;
    j["samples_per_s"] = a.batch / median(t);
    j["samples_per_s_min"] = a.batch / t.back();
    j["samples_per_s_max"] = a.batch / t.front();
    j["steps"] = t.size();
    j["vs_plain"] = a.batch / median(t) / plain;
    j["peak_bytes"] = peaks[describe(v)];
    out << j.dump() << "\n";
    out.flush();
    std::cout << j.dump() << "\n";
  }

  // 2. Peak memory per recomputation mode (2 stages, 1F1B, 8 micro-batches).
  for (Recompute mode : {Recompute::Never, Recompute::ExceptLast, Recompute::Always}) {
    reset_peak();
    Variant v{"pipeline", 2, 8, schedule::Kind::OneFOneB, mode};
    auto t = run(v, m.layers, x, y, 2, 1);
    json j = common;
    j["measure"] = "peak_memory";
    j["variant"] = describe(v);
    j["peak_bytes"] = peak();
    j["samples_per_s"] = a.batch / median(t);
    out << j.dump() << "\n";
    out.flush();
    std::cout << j.dump() << "\n";
  }

  largest_batches(m.layers, a, common, out);
  return 0;
}
