// Assertions shared by the test suites.
#pragma once

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <string>

#include "common/error.h"

namespace pipetrain::test {

// Success when both modules have the same parameter names with bit-identical values.
inline ::testing::AssertionResult same_parameters(const torch::nn::Module& a, const torch::nn::Module& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  if (pa.size() != pb.size())
    return ::testing::AssertionFailure() << pa.size() << " parameters against " << pb.size();
  for (const auto& p : pa) {
    const at::Tensor* other = pb.find(p.key());
    if (!other) return ::testing::AssertionFailure() << p.key() << " is missing";
    if (!torch::equal(p.value(), *other)) return ::testing::AssertionFailure() << p.key() << " differs";
  }
  return ::testing::AssertionSuccess();
}

// Mean cross-entropy of class scores [..., C] against targets [...]: the tests' stage loss.
inline at::Tensor mean_cross_entropy(const at::Tensor& out, const at::Tensor& target) {
  return torch::nn::functional::cross_entropy(out.reshape({-1, out.size(-1)}), target.reshape({-1}));
}

// |got - want| / |want| (Frobenius norms): how far a result is from its reference.
inline double rel_error(const at::Tensor& got, const at::Tensor& want) {
  return (got - want).norm().item<double>() / std::max(want.norm().item<double>(), 1e-30);
}

// A layer that fails on its `fail_at`-th call, to test error propagation.
struct FailingImpl : torch::nn::Module {
  int calls = 0, fail_at;
  explicit FailingImpl(int fail_at) : fail_at(fail_at) {}
  at::Tensor forward(const at::Tensor& x) {
    if (++calls == fail_at) TORCH_CHECK(false, "injected failure");
    return x;
  }
};
TORCH_MODULE(Failing);

// What `fn` threw as a TransportError ("" when it did not throw); `peer` gets the rank it names.
inline std::string transport_error_of(const std::function<void()>& fn, int* peer = nullptr) {
  try {
    fn();
  } catch (const TransportError& e) {
    if (peer) *peer = e.peer();
    return e.what();
  }
  return "";
}

}  // namespace pipetrain::test
