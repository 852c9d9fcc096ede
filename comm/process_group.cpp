// c10d process groups (comm/process_group.h). The Gloo declarations need gloo's headers, which
// PyTorch's wheel does not ship: Debian's libgloo-dev provides them (the library itself is
// libtorch's own copy; only declarations are taken from the headers).
#include "comm/process_group.h"

#include <cstdlib>

#include <chrono>
#include <exception>
#include <mutex>
#include <thread>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "common/broken_pipe.h"
#include "common/config.h"
#include "common/error.h"
#include "common/strings.h"

namespace pipetrain::comm {

std::string error_reason(const std::exception& e) {
  const auto* c = dynamic_cast<const c10::Error*>(&e);
  std::string text = c ? c->what_without_backtrace() : e.what();
  if (auto nl = text.find('\n'); nl != std::string::npos) text.resize(nl);
  return printable(text);
}

namespace {

std::chrono::milliseconds ms(double seconds) {
  return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(seconds * 1e3)));
}
}  // namespace

ProcessGroup make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank,
                             int size, const std::string& interface, double timeout_s) {
  if (size < 1 || rank < 0 || rank >= size)
    throw ConfigError(detail::concat("process group ", prefix, ": member ", rank, " outside a group of ", size));
  ignore_broken_pipe();  // Gloo writes with writev(): a closed peer must be EPIPE, not SIGPIPE
  try {
    auto options = c10d::ProcessGroupGloo::Options::create(ms(timeout_s));
    options->devices.push_back(interface.empty() ? c10d::ProcessGroupGloo::createDefaultDevice()
                                                 : c10d::ProcessGroupGloo::createDeviceForInterface(interface));
    options->threads = 1;  // the reductions of one stage run one after the other anyway
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
    return c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, options);
  } catch (const std::exception& e) {
    throw TransportError(-1, detail::concat("process group ", prefix, ": member ", rank, " of ", size,
                                            " could not join: ", error_reason(e)));
  }
}

std::vector<std::vector<ProcessGroup>> make_local_gloo_groups(int count, int size, double timeout_s) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::vector<ProcessGroup>> groups(count, std::vector<ProcessGroup>(size));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(count) * size);
  std::vector<std::thread> joiners;
  // Every member blocks until all have joined: one thread each.
  for (int g = 0; g < count; ++g)
    for (int m = 0; m < size; ++m)
      joiners.emplace_back([&, g, m] {
        try {
          groups[g][m] = make_gloo_group(store, detail::concat("group", g, "/"), m, size, "lo", timeout_s);
        } catch (...) {
          errors[static_cast<size_t>(g) * size + m] = std::current_exception();
        }
      });
  for (auto& t : joiners) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return groups;
}

namespace {
std::mutex& start_mutex() {
  static std::mutex m;
  return m;
}
}  // namespace

c10::intrusive_ptr<c10d::Work> all_reduce(c10d::Backend& group, std::vector<at::Tensor>& tensors) {
  std::lock_guard<std::mutex> one_at_a_time(start_mutex());
  return group.allreduce(tensors);
}

c10::intrusive_ptr<c10d::Work> reduce_scatter(c10d::Backend& group, at::Tensor& out, at::Tensor& in) {
  std::lock_guard<std::mutex> one_at_a_time(start_mutex());
  return group._reduce_scatter_base(out, in);
}

c10::intrusive_ptr<c10d::Work> all_gather(c10d::Backend& group, at::Tensor& out, at::Tensor& in) {
  std::lock_guard<std::mutex> one_at_a_time(start_mutex());
  return group._allgather_base(out, in);
}

c10::intrusive_ptr<c10d::Work> send(c10d::Backend& group, at::Tensor& tensor, int peer, int tag) {
  std::vector<at::Tensor> one{tensor};
  std::lock_guard<std::mutex> one_at_a_time(start_mutex());
  return group.send(one, peer, tag);
}

c10::intrusive_ptr<c10d::Work> recv(c10d::Backend& group, at::Tensor& tensor, int peer, int tag) {
  std::vector<at::Tensor> one{tensor};
  std::lock_guard<std::mutex> one_at_a_time(start_mutex());
  return group.recv(one, peer, tag);
}

void prepare_nccl_environment() { ::setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2", /*overwrite=*/0); }

#if !PIPETRAIN_HAVE_NCCL
ProcessGroup make_nccl_group(const c10::intrusive_ptr<c10d::Store>&, const std::string&, int, int, double) {
  throw ConfigError("comm: NCCL is not compiled into this build (a libtorch with CUDA and NCCL at configure time)");
}
#endif

void wait_work(const c10::intrusive_ptr<c10d::Work>& work, Deadline deadline) {
  try {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline.at - Clock::now());
    if (!work->wait(std::max(left, std::chrono::milliseconds(1))))
      throw TimeoutError(-1, "no answer before the deadline");
  } catch (const TransportError&) {
    throw;
  } catch (const std::exception& e) {
    const std::string why = error_reason(e);
    if (deadline.passed() || why.find("imed out") != std::string::npos)
      throw TimeoutError(-1, "no answer before the deadline (" + why + ")");
    throw TransportError(-1, why);
  }
}

}  // namespace pipetrain::comm
