// Tests that need a CUDA device (ctest label gpu). Without one each test skips and says why;
// scripts/gpu.sh builds and runs them on a GPU machine.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "comm/process_group.h"
#include "comm/transport.h"
#include "common/error.h"
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
  o.backend = "nccl";
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

}  // namespace
