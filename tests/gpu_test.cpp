// Tests that need a CUDA device (ctest label gpu). Without one each test skips and says why;
// scripts/gpu.sh builds and runs them on a GPU machine.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include <torch/torch.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "comm/process_group.h"
#include "comm/transport.h"
#include "common/config.h"
#if PIPETRAIN_HAVE_UCX
#include "comm/ucx/testing.h"
#endif
#include "common/error.h"
#if PIPETRAIN_HAVE_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif
#include "common/rng.h"
#include "models/decoder.h"
#include "models/hf_lora.h"
#include "models/layers.h"
#include "models/model.h"
#include "pipeline/pipeline.h"
#include "profiler/profile.h"
#include "stages/device.h"
#include "stages/accelerator.h"

namespace {

using pipetrain::stages::accelerator_info;

// Skips the calling test, with the reason, when this process sees no GPU.
#define REQUIRE_GPU()                                                                           \
  do {                                                                                          \
    const auto acc_ = accelerator_info();                                                       \
    if (acc_.gpus == 0) GTEST_SKIP() << "no CUDA device: " << acc_.no_gpu_reason;                \
  } while (0)

// The report of --version agrees with libtorch's own view of the devices.
TEST(Gpu, AcceleratorReportAgreesWithLibtorch) {
  REQUIRE_GPU();
  const auto acc = accelerator_info();
  EXPECT_TRUE(acc.cuda);
  EXPECT_EQ(acc.gpus, static_cast<int>(torch::cuda::device_count()));
  EXPECT_TRUE(torch::cuda::is_available());
  EXPECT_FALSE(acc.cudnn.empty()) << "libtorch has no cuDNN";
  EXPECT_FALSE(acc.nccl_version.empty()) << "NCCL did not report its version";
}

// A small network's loss and every parameter gradient on the GPU equal the CPU's (float64,
// deterministic kernels): the libtorch this build links computes on the device.
TEST(Gpu, NetworkGradientsMatchTheCpu) {
  REQUIRE_GPU();
  torch::manual_seed(0);
  torch::nn::Sequential cpu(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).padding(1)),
                            torch::nn::Functional(torch::relu), torch::nn::Flatten(),
                            torch::nn::Linear(4 * 8 * 8, 10));
  cpu->to(torch::kDouble);
  torch::nn::Sequential gpu = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(cpu->clone());
  gpu->to(torch::Device(torch::kCUDA, 0));
  const auto x = torch::randn({16, 1, 8, 8}, torch::kDouble);
  const auto y = torch::randint(0, 10, {16}, torch::kLong);
  at::globalContext().setDeterministicAlgorithms(true, false);
  const auto lc = torch::nn::functional::cross_entropy(cpu->forward(x), y);
  lc.backward();
  const auto lg = torch::nn::functional::cross_entropy(gpu->forward(x.cuda()), y.cuda());
  lg.backward();
  EXPECT_NEAR(lc.item<double>(), lg.item<double>(), 1e-10);
  const auto pc = cpu->named_parameters(), pg = gpu->named_parameters();
  ASSERT_EQ(pc.size(), pg.size());
  for (const auto& p : pc) {
    const auto g = pg[p.key()].grad().cpu();
    const double rel = (g - p.value().grad()).norm().item<double>() / p.value().grad().norm().item<double>();
    EXPECT_LT(rel, 1e-10) << p.key();
  }
}

}  // namespace

namespace {

// The NCCL backend's set-up on this machine's one GPU: a group of one joins, all-reduces a CUDA
// tensor, and the c10d transport over it ("nccl") delivers a CUDA tensor to itself and refuses
// after an abort. (Two ranks need two GPUs: not on a one-GPU machine.)
TEST(Gpu, NcclGroupOfOneReducesAndTheTransportSendsToItself) {
  REQUIRE_GPU();
  using namespace pipetrain;
  auto store = c10::make_intrusive<c10d::HashStore>();
  comm::ProcessGroup group = comm::make_nccl_group(store, "test/", 0, 1, 60);
  std::vector<at::Tensor> t{torch::full({4}, 3.0, torch::kCUDA)};
  comm::wait_work(comm::all_reduce(*group, t), Deadline::after(60));
  EXPECT_EQ(t[0].sum().item<double>(), 12.0);

  comm::TransportOptions o;
  o.backend = pipetrain::comm::Backend::Nccl;
  o.device = c10::Device(c10::kCUDA, 0);
  auto endpoint = comm::make_group_transport(o, store, "transport/", 0, 1, "lo");
  const comm::MessageId id{comm::Kind::Activation, 2, 0, 0};
  endpoint->send(0, id, torch::arange(5, torch::kCUDA));
  const at::Tensor got = endpoint->recv(0, id, Deadline::after(60));
  EXPECT_TRUE(got.is_cuda());
  EXPECT_EQ(got.sum().item<int64_t>(), 10);
  endpoint->abort("test");
  EXPECT_THROW(endpoint->recv(0, id, Deadline::after(1)), TransportError);
}

#if PIPETRAIN_HAVE_UCX
// UCX built with CUDA (the libucx-cu13 wheel: UCX_CUDA=1 in --version) is handed a GPU's tensor
// as device memory: two ranks of one process on the GPU, a 4 MiB activation each way, received on
// the GPU with the sent values, and not a byte staged through the host by the transport. (Within
// one process UCX does not use cuda_ipc and may bounce the bytes through buffers of its own;
// between two processes, gpu_processes_test and bench/transfer_gpu, it can map the peer's memory.)
TEST(Gpu, UcxCarriesDeviceMemoryWithoutAHostCopy) {
  REQUIRE_GPU();
  using namespace pipetrain;
  if (!PIPETRAIN_UCX_CUDA) GTEST_SKIP() << "this build's UCX has no CUDA support (UCX_CUDA=0)";
  comm::TransportOptions o;
  o.backend = pipetrain::comm::Backend::Ucx;
  o.device = c10::Device(c10::kCUDA, 0);
  o.detect_peer_failure = false;  // two ranks of one process: no peer to lose
  auto group = comm::make_transport_group(o, 2);
  const uint64_t staged = comm::ucx_host_staged_bytes_for_test();
  const at::Tensor up = torch::arange(1 << 20, torch::TensorOptions().dtype(torch::kFloat).device(torch::kCUDA));
  const at::Tensor down = up * 2;
  const comm::MessageId a{comm::Kind::Activation, 0, 0, 0}, g{comm::Kind::Grad, 0, 0, 0};
  std::thread other([&] { group[1]->send(0, g, down); });
  group[0]->send(1, a, up);
  const at::Tensor got_a = group[1]->recv(0, a, Deadline::after(60));
  const at::Tensor got_g = group[0]->recv(1, g, Deadline::after(60));
  other.join();
  EXPECT_TRUE(got_a.is_cuda());
  EXPECT_TRUE(got_g.is_cuda());
  EXPECT_TRUE(torch::equal(got_a, up));
  EXPECT_TRUE(torch::equal(got_g, down));
  EXPECT_EQ(comm::ucx_host_staged_bytes_for_test(), staged) << "the transport copied a GPU tensor to the host";
}
#endif

}  // namespace

namespace {

// What runs on the GPU's own clock and allocator: the keyed dropout mask drawn on the device is
// the host's bit for bit; a stage's stamps time the device's work; the profiler measures layers
// on the device (positive times, the caching allocator's bytes); a pipeline's trace on the GPU
// holds device times, each compute inside the step.
TEST(Gpu, DeviceClockMasksAndProfile) {
  REQUIRE_GPU();
  using namespace pipetrain;
  const c10::Device gpu(c10::kCUDA, 0);
  std::vector<uint64_t> keys;
  for (int i = 0; i < 4; ++i) keys.push_back(rng_key(1, 2, 3, i));
  const auto host = models::keyed_keep_mask(keys, {16, 33}, 0.8, at::TensorOptions().dtype(at::kFloat));
  const auto dev = models::keyed_keep_mask(keys, {16, 33}, 0.8, at::TensorOptions().dtype(at::kFloat).device(gpu));
  EXPECT_TRUE(dev.is_cuda());
  EXPECT_TRUE(torch::equal(host, dev.cpu()));

  const auto ctx = stages::make_device_context(gpu);
  {
    const auto scope = ctx->enter();
    const stages::Stamp origin = ctx->stamp(100.0);
    const auto a = torch::randn({2048, 2048}, torch::TensorOptions().device(gpu));
    for (int i = 0; i < 8; ++i) (void)a.mm(a);
    const stages::Stamp p = ctx->stamp(5.0);
    ctx->synchronize();
    const double t = stages::DeviceContext::resolve(origin, p);
    EXPECT_GT(t, 100.0);
    EXPECT_LT(t, 160.0);
    EXPECT_GT(ctx->allocated_bytes(), 0);
  }

  torch::nn::Sequential model(torch::nn::Linear(64, 128), torch::nn::Functional(torch::relu), torch::nn::Linear(128, 10));
  profiler::ProfileOptions o;
  o.device = gpu;
  o.repeat = 3;
  const auto x = torch::randn({32, 64});
  const auto y = torch::randint(0, 10, {32}, torch::kLong);
  auto loss = [](const at::Tensor& out, const at::Tensor& t) { return torch::nn::functional::cross_entropy(out, t); };
  const profiler::Profile p = profiler::profile_layers(model, x, y, loss, o);
  ASSERT_EQ(p.layers.size(), 3u);
  for (const auto& l : p.layers) {
    EXPECT_GT(l.forward_ms, 0) << l.name;
    EXPECT_GT(l.backward_ms, 0) << l.name;
  }
  EXPECT_GT(p.layers[0].saved_bytes, 0);
  EXPECT_TRUE(model->parameters()[0].is_cuda());

  pipeline::PipelineOptions po;
  po.stages = 2;
  po.micro_batches = 4;
  po.devices = {gpu, gpu};
  torch::nn::Sequential m2(torch::nn::Linear(64, 128), torch::nn::Functional(torch::relu), torch::nn::Linear(128, 10));
  pipeline::Pipeline pipe(m2, po, loss);
  pipe.forward_backward(x, y);
  const auto& trace = pipe.last_trace();
  for (const auto& stage : trace.spans)
    for (const auto& sp : stage) {
      EXPECT_LE(sp.start, sp.end);
      EXPECT_GE(sp.start, 0);
      EXPECT_LE(sp.end, trace.wall + 1e-3);
    }
}

}  // namespace

namespace {

// Two pipelines from the same weights, one with CUDA graphs: `steps` SGD steps on the same
// batches. Returns each run's losses and final parameters.
struct GraphRun {
  std::vector<double> losses;
  std::vector<at::Tensor> params;
  std::vector<std::vector<int>> graphed;       // per step, per stage
  std::vector<std::vector<int64_t>> host_reads;  // per step, per stage
};

// Two stages of `model` on the one GPU, 1F1B over 4 micro-batches, no recomputation, cross-entropy.
std::unique_ptr<pipetrain::pipeline::Pipeline> two_stages_on_the_gpu(torch::nn::Sequential model, bool graphs,
                                                                      pipetrain::Precision precision) {
  using namespace pipetrain;
  pipeline::PipelineOptions o;
  o.stages = 2;
  o.micro_batches = 4;
  o.schedule = schedule::Kind::OneFOneB;
  o.devices = {c10::Device("cuda:0")};
  o.precision = precision;
  o.recompute = Recompute::Never;  // graphs keep every micro-batch's activations (refused otherwise)
  o.cuda_graphs = graphs;
  return std::make_unique<pipeline::Pipeline>(model, o, [](const at::Tensor& out, const at::Tensor& y) {
    return torch::nn::functional::cross_entropy(out, y);
  });
}

GraphRun run_graphs(bool graphs, pipetrain::Precision precision, int64_t last_rows) {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(32, 64), torch::nn::Tanh(), torch::nn::Linear(64, 64),
                              torch::nn::LayerNorm(torch::nn::LayerNormOptions({64})), torch::nn::Linear(64, 64),
                              torch::nn::ReLU(), torch::nn::Linear(64, 10));
  const auto piped = two_stages_on_the_gpu(model, graphs, precision);
  auto& pipe = *piped;
  pipe.optimizers().set([](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.05).momentum(0.9));
  });
  GraphRun r;
  torch::manual_seed(1);
  for (int step = 0; step < 5; ++step) {
    const int64_t rows = step == 4 ? last_rows : 32;  // the last batch may be short: another shape
    r.losses.push_back(pipe.train_step(torch::randn({rows, 32}), torch::randint(0, 10, {rows}, torch::kLong)));
    r.graphed.push_back(pipe.last_trace().graphed);
    r.host_reads.push_back(pipe.last_trace().host_reads);
  }
  for (const auto& p : model->parameters()) r.params.push_back(p.detach().cpu());
  return r;
}

}  // namespace

// CUDA graphs per stage (pipeline.cuda_graphs) give the eager run's losses and weights bit for
// bit, in float32 and bf16: the first step eager, every micro-batch from a graph after it, a
// short last batch (another shape) eagerly; and no host read inside any step's list.
TEST(Gpu, CudaGraphsEqualEagerBitForBit) {
  REQUIRE_GPU();
  using pipetrain::Precision;
  for (const Precision precision : {Precision::FP32, Precision::BF16})
    for (const int64_t last_rows : {int64_t{32}, int64_t{20}}) {
      const GraphRun eager = run_graphs(false, precision, last_rows), graphed = run_graphs(true, precision, last_rows);
      const std::string what = std::string(pipetrain::precision_name(precision)) + " last batch " + std::to_string(last_rows);
      for (size_t i = 0; i < eager.losses.size(); ++i) EXPECT_EQ(eager.losses[i], graphed.losses[i]) << what << " step " << i;
      ASSERT_EQ(eager.params.size(), graphed.params.size());
      for (size_t i = 0; i < eager.params.size(); ++i) EXPECT_TRUE(torch::equal(eager.params[i], graphed.params[i])) << what << " parameter " << i;
      for (size_t step = 0; step < graphed.graphed.size(); ++step)
        for (size_t s = 0; s < 2; ++s) {
          const int want = step == 0 ? 0 : step == 4 && last_rows != 32 ? 0 : 4;
          EXPECT_EQ(graphed.graphed[step][s], want) << what << " step " << step << " stage " << s;
          EXPECT_EQ(eager.graphed[step][s], 0) << what;
          EXPECT_EQ(graphed.host_reads[step][s], 0) << what << " step " << step << " stage " << s;
          EXPECT_EQ(eager.host_reads[step][s], 0) << what << " step " << step << " stage " << s;
        }
    }
}

// A step on the GPU issues no host synchronization but its own: with CUDA's sync-debug mode set
// to error, any synchronizing call inside a forward_backward (an item(), a pageable copy, a
// stream's synchronize, in a layer, the loss or the runner) throws and fails the step, naming the
// stage and action. The step's own waits (the losses read once, the stamps resolved once) go
// through stages::DeviceContext::to_host and synchronize(), which wait for an event, which the
// mode does not flag, and which host_reads counts: none inside the lists.
#if PIPETRAIN_HAVE_CUDA
TEST(Gpu, AStepIssuesNoHostSynchronization) {
  REQUIRE_GPU();
  using namespace pipetrain;
  for (const bool graphs : {false, true}) {
    torch::manual_seed(0);
    torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::Tanh(), torch::nn::Linear(32, 32),
                                torch::nn::ReLU(), torch::nn::Linear(32, 4));
    const auto piped = two_stages_on_the_gpu(model, graphs, Precision::FP32);
    auto& pipe = *piped;
    const at::Tensor x = torch::randn({16, 16}), y = torch::randint(0, 4, {16}, torch::kLong);
    for (int warm = 0; warm < 2; ++warm) pipe.forward_backward(x, y);  // lazy set-up; graphs captured
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
    std::string error;
    double loss = 0;
    try {
      loss = pipe.forward_backward(x, y);
    } catch (const std::exception& e) {
      error = e.what();
    }
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
    EXPECT_EQ(error, "") << (graphs ? "graphs" : "eager");
    EXPECT_TRUE(std::isfinite(loss));
    EXPECT_EQ(pipe.last_trace().host_reads, std::vector<int64_t>({0, 0}));
    if (graphs) EXPECT_EQ(pipe.last_trace().graphed, std::vector<int>({4, 4}));
  }
}

// A mixture of experts with its products grouped (experts_kernel "grouped") on the GPU in
// bfloat16: two stages, each holding one, replayed from CUDA graphs after the first step, equal
// to eager bit for bit, and a step under CUDA's sync-debug mode set to error issues no host
// synchronization (the expert-by-expert loop reads each expert's rows on the host).
TEST(Gpu, GroupedExpertsReplayWithoutAHostSynchronization) {
  REQUIRE_GPU();
  using namespace pipetrain;
  auto experts = [] {
    models::LlamaBlockOptions o;
    o.d_model = 32;
    o.d_ff = 64;
    o.experts = 8;
    o.experts_per_token = 2;
    o.grouped_experts = true;
    return models::Moe(o);
  };
  std::vector<std::vector<double>> losses;
  for (const bool graphs : {false, true}) {
    torch::manual_seed(0);
    torch::nn::Sequential model(torch::nn::Linear(16, 32), experts(), torch::nn::Tanh(), experts(), torch::nn::Linear(32, 4));
    const auto piped = two_stages_on_the_gpu(model, graphs, Precision::BF16);
    auto& pipe = *piped;
    pipe.optimizers().set([](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.05)); });
    torch::manual_seed(1);
    losses.emplace_back();
    for (int step = 0; step < 3; ++step) {
      losses.back().push_back(pipe.train_step(torch::randn({32, 16}), torch::randint(0, 4, {32}, torch::kLong)));
      if (graphs && step > 0) EXPECT_EQ(pipe.last_trace().graphed, std::vector<int>({4, 4})) << "step " << step;
    }
    const at::Tensor x = torch::randn({32, 16}), y = torch::randint(0, 4, {32}, torch::kLong);
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
    std::string error;
    try {
      pipe.forward_backward(x, y);
    } catch (const std::exception& e) {
      error = e.what();
    }
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
    EXPECT_EQ(error, "") << (graphs ? "graphs" : "eager");
    EXPECT_EQ(pipe.last_trace().host_reads, std::vector<int64_t>({0, 0}));
  }
  EXPECT_EQ(losses[0], losses[1]);
}

// LoRA on the GPU with its frozen weights in bfloat16 (model.frozen_dtype): two Llama blocks with
// adapters on every projection, everything but the adapters frozen, 2 stages in bf16, eager and
// from CUDA graphs: the same losses and adapters bit for bit as with float32 frozen weights, the
// frozen weights unchanged.
TEST(Gpu, LoraWithBfloat16FrozenWeightsStepsAsWithFloat32Ones) {
  REQUIRE_GPU();
  using namespace pipetrain;
  auto run = [](bool low, bool graphs) {
    models::LlamaBlockOptions o;
    o.d_model = 32, o.n_heads = 4, o.n_kv_heads = 2, o.head_dim = 8, o.d_ff = 48;
    o.lora.rank = 4, o.lora.alpha = 8, o.lora.targets = models::lora_target_names();
    torch::manual_seed(0);
    models::Model m;
    m.layers = torch::nn::Sequential(torch::nn::Linear(16, 32), models::LlamaBlock(o), models::LlamaBlock(o), torch::nn::Linear(32, 4));
    models::freeze_all_but_adapters(*m.layers);
    m.frozen = low ? Precision::BF16 : Precision::FP32;
    EXPECT_EQ(models::store_frozen(m), low ? 2u * 7 + 2 : 0u);
    const std::vector<at::Tensor> before = [&] {
      std::vector<at::Tensor> v;
      for (const auto& p : m.layers->parameters()) v.push_back(p.detach().clone());
      return v;
    }();
    pipeline::PipelineOptions po;
    po.stages = 2, po.micro_batches = 4, po.devices = {c10::Device("cuda:0")}, po.precision = Precision::BF16;
    po.recompute = Recompute::Never, po.cuda_graphs = graphs;
    pipeline::Pipeline pipe(m.layers, po, [](const at::Tensor& out, const at::Tensor& y) {
      return torch::nn::functional::cross_entropy(out.reshape({-1, out.size(-1)}).to(at::kFloat), y.reshape({-1}));
    });
    pipe.optimizers().set([](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-2)); });
    torch::manual_seed(1);
    struct {
      std::vector<double> first;
      std::vector<at::Tensor> second;
      std::vector<bool> frozen;
    } r;
    for (int step = 0; step < 3; ++step) r.first.push_back(pipe.train_step(torch::randn({8, 6, 16}), torch::randint(0, 4, {8, 6}, torch::kLong)));
    const auto params = m.layers->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      r.second.push_back(params[i].detach().cpu().to(at::kFloat));
      r.frozen.push_back(params[i].scalar_type() == at::kBFloat16);  // kept in bfloat16
      if (!params[i].requires_grad()) EXPECT_TRUE(torch::equal(params[i].detach().cpu(), before[i])) << "frozen parameter " << i;
    }
    return r;
  };
  const auto wide = run(false, false);
  for (const bool graphs : {false, true}) {
    const auto low = run(true, graphs);
    EXPECT_EQ(low.first, wide.first) << (graphs ? "graphs" : "eager");
    for (size_t i = 0; i < wide.second.size(); ++i)
      EXPECT_TRUE(torch::equal(low.second[i], low.frozen[i] ? wide.second[i].to(at::kBFloat16).to(at::kFloat) : wide.second[i]))
          << (graphs ? "graphs" : "eager") << " parameter " << i;
  }
}
#endif
