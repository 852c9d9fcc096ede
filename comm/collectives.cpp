#include "comm/collectives.h"

#include <exception>

#include <ATen/ATen.h>

#include "common/deadline.h"
#include "common/error.h"

namespace pipetrain::comm {

MessageId collective_message(Collective op, int64_t seq, const char* what) {
  return MessageId{Kind::Control, static_cast<int>(seq & 0x7fffffff), static_cast<int>(op), seq, what};
}

Collectives::Collectives(Transport& endpoint, double timeout_s) : t_(&endpoint), timeout_s_(timeout_s) {}

void Collectives::check_usable() const {
  if (!failure_.empty())
    throw Error(detail::concat("rank ", rank(), " cannot continue after an earlier failure: ", failure_));
}

void Collectives::abort(const std::string& reason) {
  if (!failure_.empty()) return;
  failure_ = reason;
  if (t_) t_->abort(detail::concat("rank ", t_->rank(), " failed: ", reason));
}

// Tells the peers, then rethrows the error being handled (its type says timeout or transport).
void Collectives::fail(const std::string& what) {
  abort(what);
  std::rethrow_exception(std::current_exception());
}

// Every rank sends `mine` to every other and receives theirs: no rank returns before every rank
// has called. The result is indexed by rank.
std::vector<at::Tensor> Collectives::all_to_all(Collective op, const at::Tensor& mine, const char* what) {
  check_usable();
  if (!t_) return {mine};
  const MessageId id = collective_message(op, seq_++, what);
  const int self = rank(), world = world_size();
  std::vector<at::Tensor> all(world);
  all[self] = mine;
  try {
    for (int d = 0; d < world; ++d)
      if (d != self) t_->send(d, id, mine);
    const Deadline deadline = Deadline::after(timeout_s_);
    for (int d = 0; d < world; ++d)
      if (d != self) all[d] = t_->recv(d, id, deadline);
  } catch (const std::exception& e) {
    fail(e.what());
  }
  return all;
}

std::vector<at::Tensor> Collectives::all_gather(const at::Tensor& mine, const char* what) {
  return all_to_all(Collective::AllGather, mine, what);
}

std::vector<std::vector<double>> Collectives::all_gather(const std::vector<double>& mine, const char* what) {
  std::vector<std::vector<double>> out;
  for (const at::Tensor& t : all_gather(at::tensor(mine, at::kDouble), what)) {
    const at::Tensor c = t.to(at::kDouble).contiguous();
    out.emplace_back(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  }
  return out;
}

at::Tensor Collectives::broadcast(const at::Tensor& value, int root, const char* what) {
  check_usable();
  if (root < 0 || root >= world_size())
    throw Error(detail::concat("broadcast of ", what, ": root rank ", root, " outside a world of ", world_size()));
  if (!t_) return value;
  const MessageId id = collective_message(Collective::Broadcast, seq_++, what);
  const int self = rank(), world = world_size();
  try {
    if (self == root) {
      for (int d = 0; d < world; ++d)
        if (d != self) t_->send(d, id, value);
      return value;
    }
    return t_->recv(root, id, Deadline::after(timeout_s_));
  } catch (const std::exception& e) {
    fail(e.what());
  }
}

std::vector<double> Collectives::broadcast(const std::vector<double>& values, int root, const char* what) {
  const at::Tensor mine = rank() == root ? at::tensor(values, at::kDouble) : at::zeros({0}, at::kDouble);
  const at::Tensor c = broadcast(mine, root, what).to(at::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

bool Collectives::any(bool flag, const char* what) {
  for (const at::Tensor& t : all_gather(at::tensor({flag ? 1 : 0}, at::kInt), what))
    if (t.numel() != 1 || t.item<int>() != 0) return true;
  return false;
}

void Collectives::barrier(const char* what) { all_to_all(Collective::Barrier, at::zeros({0}, at::kInt), what); }

}  // namespace pipetrain::comm
