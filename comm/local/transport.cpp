// local: the in-process backend. Ranks are threads of one process sharing a hub of mailboxes;
// a message is the encoded header plus the tensor itself (no copy). The receiver decodes and
// validates the header exactly as a network backend would.
#include "comm/local/transport.h"

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <tuple>

#include <ATen/ATen.h>

#include "common/error.h"

namespace pipetrain::comm {

namespace {

struct Message {
  std::array<uint8_t, kWireHeaderBytes> header;
  at::Tensor tensor;
};

struct Hub {
  explicit Hub(TransportOptions o) : options(o) {}
  TransportOptions options;
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::tuple<int, int, uint64_t>, std::deque<Message>> boxes;  // (src, dst, tag)
  bool aborted = false;
  std::string abort_reason;
};

class LocalTransport : public Transport {
 public:
  LocalTransport(std::shared_ptr<Hub> hub, int rank, int world) : hub_(std::move(hub)), rank_(rank), world_(world) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return "local"; }

  void send(int dst, const MessageId& id, const at::Tensor& tensor) override {
    check_peer(dst);
    Message msg{encode(make_header(tensor, id)), tensor};
    {
      std::lock_guard<std::mutex> lock(hub_->mu);
      if (hub_->aborted)
        throw TransportError(dst, detail::concat("rank ", rank_, ": cannot send ", id.describe(),
                                                 " to rank ", dst, ": aborted: ", hub_->abort_reason));
      hub_->boxes[{rank_, dst, hub_->options.in_order ? 0 : id.tag()}].push_back(std::move(msg));
    }
    hub_->cv.notify_all();
  }

  at::Tensor recv(int src, const MessageId& id, Deadline deadline) override {
    check_peer(src);
    std::unique_lock<std::mutex> lock(hub_->mu);
    auto key = std::make_tuple(src, rank_, hub_->options.in_order ? uint64_t(0) : id.tag());
    for (;;) {
      if (hub_->aborted)
        throw TransportError(src, detail::concat("rank ", rank_, ": aborted while waiting for ",
                                                 id.describe(), " from rank ", src, ": ",
                                                 hub_->abort_reason));
      auto it = hub_->boxes.find(key);
      if (it != hub_->boxes.end() && !it->second.empty()) {
        Message msg = std::move(it->second.front());
        it->second.pop_front();
        if (it->second.empty()) hub_->boxes.erase(it);
        lock.unlock();
        return validate(msg, id, src);
      }
      if (hub_->cv.wait_until(lock, deadline.at) == std::cv_status::timeout && deadline.passed()) {
        auto again = hub_->boxes.find(key);
        if (again == hub_->boxes.end() || again->second.empty())
          throw TimeoutError(src, detail::concat("rank ", rank_, ": timed out waiting for ",
                                                 id.describe(), " from rank ", src));
      }
    }
  }

  void abort(const std::string& reason) override {
    {
      std::lock_guard<std::mutex> lock(hub_->mu);
      if (hub_->aborted) return;
      hub_->aborted = true;
      hub_->abort_reason = reason;
      hub_->boxes.clear();
    }
    hub_->cv.notify_all();
  }

 private:
  void check_peer(int peer) const {
    if (peer < 0 || peer >= world_)
      throw TransportError(peer, detail::concat("rank ", rank_, ": peer rank ", peer,
                                                " outside world of size ", world_));
  }

  at::Tensor validate(const Message& msg, const MessageId& id, int src) const {
    WireHeader h = decode(msg.header.data(), msg.header.size(), hub_->options.max_message_bytes, src);
    check_received(h, id, rank_, src);
    PIPETRAIN_CHECK(msg.tensor.sizes().vec() == h.dims, "local message shape differs from its header");
    return msg.tensor;
  }

  std::shared_ptr<Hub> hub_;
  int rank_, world_;
};

}  // namespace

std::vector<std::unique_ptr<Transport>> make_local_group(int world_size, TransportOptions options) {
  auto hub = std::make_shared<Hub>(options);
  std::vector<std::unique_ptr<Transport>> group;
  for (int r = 0; r < world_size; ++r) group.push_back(std::make_unique<LocalTransport>(hub, r, world_size));
  return group;
}

}  // namespace pipetrain::comm
