// .npy files (numpy.save) as the data kinds read them: the header checked (magic, format version
// 1 to 3, a bounded length, C order, a shape of at most 2^50 values) and the array memory-mapped,
// so that a data set larger than memory streams through the page cache. Used by data.kind
// tensors (job/tensors_data.h) and data.kind tokens (job/tokens_data.h); every problem is a
// DataError naming the file. Tests: tests/tensors_data_test.cpp, tests/tokens_data_test.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace pipetrain::job {

struct NpyHeader {
  std::string descr;           // numpy's type string as written, quotes included: "'<f4'"
  std::vector<int64_t> shape;  // at least one dimension
  int64_t count = 0;           // values (the product of the shape)
  int64_t offset = 0;          // where the data starts
  int64_t file_size = 0;
};

/// Reads and checks the header of the .npy file `file`.
NpyHeader read_npy_header(const std::string& file);

/// A regular file's size; DataError naming it for a missing file, a FIFO, a device or a folder.
int64_t regular_file_size(const std::string& file);

/// Maps `file` read-only and returns its bytes from `offset` as a tensor of `shape` and `type`
/// (unmapped when the tensor goes); the caller has checked that the file holds them.
at::Tensor map_file(const std::string& file, int64_t offset, const std::vector<int64_t>& shape, at::ScalarType type);

}  // namespace pipetrain::job
