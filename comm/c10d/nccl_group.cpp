// c10d: NCCL groups (comm/process_group.h), compiled when libtorch has CUDA and NCCL was found
// (cmake/backends.cmake). libtorch_cuda carries ProcessGroupNCCL; its header needs the switch
// libtorch was built with.
#include <cstdlib>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "comm/process_group.h"
#include "common/broken_pipe.h"
#include "common/error.h"

namespace pipetrain::comm {

ProcessGroup make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank,
                             int size, double timeout_s) {
  if (size < 1 || rank < 0 || rank >= size)
    throw ConfigError(detail::concat("process group ", prefix, ": member ", rank, " outside a group of ", size));
  prepare_nccl_environment();  // normally done before any thread started; then a no-op
  ignore_broken_pipe();  // its bootstrap talks over sockets to peers that may have gone
  try {
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(timeout_s * 1e3)));
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, rank, size, options);
  } catch (const std::exception& e) {
    throw TransportError(-1, detail::concat("process group ", prefix, ": member ", rank, " of ", size,
                                            " could not join NCCL: ", error_reason(e)));
  }
}

}  // namespace pipetrain::comm
