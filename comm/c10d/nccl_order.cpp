// c10d: the "nccl-order" point-to-point group (comm/c10d/nccl_order.h).
#include "comm/c10d/nccl_order.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <ATen/ATen.h>

#include "common/error.h"

namespace pipetrain::comm {

namespace {

class OrderWork;

struct Op {
  bool send;
  int rank, peer;
  at::Tensor tensor;
  c10::intrusive_ptr<OrderWork> work;
};

std::string describe(const Op& op) {
  return detail::concat(op.send ? "a send of " : "a receive of ", op.tensor.numel() * op.tensor.element_size(),
                        op.send ? " bytes to rank " : " bytes from rank ", op.peer);
}

// What the members share: per pair (lo, hi), the two ranks' streams (0: lo's, 1: hi's).
struct Hub {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::pair<int, int>, std::array<std::deque<Op>, 2>> streams;
  std::map<std::pair<int, int>, std::string> broken;  // pairs that deadlocked: why
};

class OrderWork final : public c10d::Work {
 public:
  OrderWork(std::shared_ptr<Hub> hub, int rank, c10d::OpType type) : c10d::Work(rank, type), hub_(std::move(hub)) {}

  bool isCompleted() override {
    std::lock_guard<std::mutex> lock(hub_->mu);
    return done_ || error_;
  }
  bool isSuccess() const override {
    std::lock_guard<std::mutex> lock(hub_->mu);
    return done_;
  }
  std::exception_ptr exception() const override {
    std::lock_guard<std::mutex> lock(hub_->mu);
    return error_;
  }

  // A host wait (the CPU has no stream to make wait): until the pair completes it, fails it or
  // `timeout` passes (false).
  bool wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(hub_->mu);
    const auto until = timeout == kNoTimeout ? std::chrono::steady_clock::time_point::max()
                                             : std::chrono::steady_clock::now() + timeout;
    while (!done_ && !error_)
      if (hub_->cv.wait_until(lock, until) == std::cv_status::timeout) break;
    if (error_) std::rethrow_exception(error_);
    return done_;
  }

  void abort() override {
    {
      std::lock_guard<std::mutex> lock(hub_->mu);
      if (done_ || error_) return;
      error_ = std::make_exception_ptr(TransportError(-1, "nccl-order: operation aborted"));
    }
    hub_->cv.notify_all();
  }

  // Under hub->mu.
  void complete() { done_ = true; }
  void fail(std::exception_ptr e) {
    if (!done_ && !error_) error_ = std::move(e);
  }

 private:
  std::shared_ptr<Hub> hub_;
  bool done_ = false;
  std::exception_ptr error_;
};

class OrderGroup final : public c10d::Backend {
 public:
  OrderGroup(std::shared_ptr<Hub> hub, int rank, int size) : c10d::Backend(rank, size), hub_(std::move(hub)) {}

  const std::string getBackendName() const override { return "nccl-order"; }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int /*tag: NCCL ignores it*/) override {
    return post(true, tensors, dst);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int /*tag*/) override {
    return post(false, tensors, src);
  }

  // As ncclCommAbort: this rank's operations fail, and so does every later one of its pairs.
  void abort() override {
    {
      std::lock_guard<std::mutex> lock(hub_->mu);
      const std::string why = detail::concat("nccl-order: rank ", rank_, " aborted its group");
      for (auto& [pair, sides] : hub_->streams) {
        if (pair.first != rank_ && pair.second != rank_) continue;
        hub_->broken.emplace(pair, why);
        for (auto& side : sides)
          for (Op& op : side) op.work->fail(std::make_exception_ptr(TransportError(op.peer, why)));
        sides[0].clear();
        sides[1].clear();
      }
      for (int peer = 0; peer < size_; ++peer)
        if (peer != rank_) hub_->broken.emplace(std::make_pair(std::min(rank_, peer), std::max(rank_, peer)), why);
    }
    hub_->cv.notify_all();
  }

 private:
  c10::intrusive_ptr<c10d::Work> post(bool is_send, std::vector<at::Tensor>& tensors, int peer) {
    TORCH_CHECK(tensors.size() == 1, "nccl-order: one tensor per operation");
    TORCH_CHECK(peer >= 0 && peer < size_ && peer != rank_, "nccl-order: no peer ", peer);
    auto work = c10::make_intrusive<OrderWork>(hub_, rank_, is_send ? c10d::OpType::SEND : c10d::OpType::RECV);
    const std::pair<int, int> pair{std::min(rank_, peer), std::max(rank_, peer)};
    {
      std::lock_guard<std::mutex> lock(hub_->mu);
      if (auto b = hub_->broken.find(pair); b != hub_->broken.end()) {
        work->fail(std::make_exception_ptr(TransportError(peer, b->second)));
      } else {
        auto& sides = hub_->streams[pair];
        sides[rank_ == pair.first ? 0 : 1].push_back({is_send, rank_, peer, tensors[0], work});
        advance(pair, sides);
      }
    }
    hub_->cv.notify_all();
    return work;
  }

  // Under hub->mu: completes matching heads; a head pair that cannot match breaks the pair.
  void advance(const std::pair<int, int>& pair, std::array<std::deque<Op>, 2>& sides) {
    while (!sides[0].empty() && !sides[1].empty()) {
      Op& a = sides[0].front();
      Op& b = sides[1].front();
      std::string why;
      if (a.send == b.send) {
        why = detail::concat("nccl-order: ranks ", pair.first, " and ", pair.second,
                             " deadlock on the stream they share (NCCL would hang here): rank ", pair.first,
                             "'s next operation is ", describe(a), ", rank ", pair.second, "'s is ", describe(b));
      } else {
        Op& s = a.send ? a : b;
        Op& r = a.send ? b : a;
        const int64_t sent = s.tensor.numel() * s.tensor.element_size();
        const int64_t room = r.tensor.numel() * r.tensor.element_size();
        if (sent != room) {
          why = detail::concat("nccl-order: ranks ", pair.first, " and ", pair.second, " matched ", describe(s),
                               " with ", describe(r), " (NCCL would deliver wrong bytes)");
        } else {
          if (sent > 0) std::memcpy(r.tensor.data_ptr(), s.tensor.contiguous().data_ptr(), static_cast<size_t>(sent));
          a.work->complete();
          b.work->complete();
          sides[0].pop_front();
          sides[1].pop_front();
          continue;
        }
      }
      hub_->broken[pair] = why;
      for (auto& side : sides)
        for (Op& op : side) op.work->fail(std::make_exception_ptr(TransportError(op.peer, why)));
      sides[0].clear();
      sides[1].clear();
      return;
    }
  }

  std::shared_ptr<Hub> hub_;
};

}  // namespace

std::vector<ProcessGroup> make_nccl_order_group(int size) {
  auto hub = std::make_shared<Hub>();
  std::vector<ProcessGroup> members;
  for (int r = 0; r < size; ++r) members.push_back(c10::make_intrusive<OrderGroup>(hub, r, size));
  return members;
}

}  // namespace pipetrain::comm
