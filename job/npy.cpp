// .npy headers and mapped files (job/npy.h).
#include "job/npy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>

#include <torch/torch.h>

#include "common/error.h"
#include "common/strings.h"

namespace pipetrain::job {

namespace {

constexpr int64_t kMaxHeader = 1 << 20;  // an .npy header: far beyond any real one

[[noreturn]] void bad(const std::string& file, const std::string& what) { throw DataError(printable(file, 300) + ": " + what); }

// The value of `key` in an .npy header's dict literal, up to its end (`,` or `}` outside parentheses).
std::string header_value(const std::string& file, const std::string& header, const std::string& key) {
  const size_t at = header.find("'" + key + "'");
  if (at == std::string::npos) bad(file, "not an .npy file: its header has no '" + key + "'");
  size_t v = header.find(':', at);
  if (v == std::string::npos) bad(file, "not an .npy file: a malformed header");
  ++v;
  int depth = 0;
  size_t end = v;
  for (; end < header.size(); ++end) {
    const char ch = header[end];
    if (ch == '(') ++depth;
    if (ch == ')') --depth;
    if (depth == 0 && (ch == ',' || ch == '}')) break;
  }
  std::string out = header.substr(v, end - v);
  const auto b = out.find_first_not_of(" "), e = out.find_last_not_of(" ");
  return b == std::string::npos ? "" : out.substr(b, e - b + 1);
}

}  // namespace

int64_t regular_file_size(const std::string& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) bad(file, std::string("cannot open (") + std::strerror(errno) + ")");
  if (!S_ISREG(st.st_mode)) bad(file, "not a regular file");
  return static_cast<int64_t>(st.st_size);
}

NpyHeader read_npy_header(const std::string& file) {
  NpyHeader h;
  h.file_size = regular_file_size(file);
  std::ifstream in(file, std::ios::binary);
  char magic[8] = {};
  if (!in.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0) bad(file, "not an .npy file (bad magic)");
  const int major = static_cast<unsigned char>(magic[6]);
  if (major < 1 || major > 3) bad(file, "an .npy file of format version " + std::to_string(major) + " (1 to 3 are read)");
  unsigned char len[4] = {};
  const int len_bytes = major == 1 ? 2 : 4;
  if (!in.read(reinterpret_cast<char*>(len), len_bytes)) bad(file, "truncated in its header");
  int64_t header_len = len[0] | (len[1] << 8);
  if (major > 1) header_len |= (int64_t{len[2]} << 16) | (int64_t{len[3]} << 24);
  if (header_len > kMaxHeader) bad(file, "an .npy header of " + std::to_string(header_len) + " bytes");
  std::string header(static_cast<size_t>(header_len), '\0');
  if (!in.read(header.data(), header_len)) bad(file, "truncated in its header");
  h.offset = 8 + len_bytes + header_len;
  h.descr = header_value(file, header, "descr");
  if (header_value(file, header, "fortran_order") != "False")
    bad(file, "is in Fortran order; save it in C order (numpy.ascontiguousarray)");
  std::string shape_text = header_value(file, header, "shape");
  int64_t count = 1;
  for (size_t i = 0; i < shape_text.size();) {
    if (!std::isdigit(static_cast<unsigned char>(shape_text[i]))) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < shape_text.size() && std::isdigit(static_cast<unsigned char>(shape_text[j]))) ++j;
    if (j - i > 12) bad(file, "a dimension of " + shape_text.substr(i, j - i));
    h.shape.push_back(std::stoll(shape_text.substr(i, j - i)));
    // Checked before multiplying: two 12-digit dimensions overflow int64 (fuzz/token_file_fuzz found it).
    const int64_t d = std::max<int64_t>(1, h.shape.back());
    if (d > (int64_t{1} << 50) / count) bad(file, "a shape of more than 2^50 values");
    count *= d;
    i = j;
  }
  if (h.shape.empty()) bad(file, "holds a scalar, not an array of samples");
  for (int64_t d : h.shape)
    if (d == 0) count = 0;
  h.count = count;
  return h;
}

at::Tensor map_file(const std::string& file, int64_t offset, const std::vector<int64_t>& shape, at::ScalarType type) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  const int64_t bytes = count * static_cast<int64_t>(c10::elementSize(type));
  if (bytes == 0) return torch::empty(shape, type);
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) bad(file, std::string("cannot open (") + std::strerror(errno) + ")");
  void* base = ::mmap(nullptr, static_cast<size_t>(offset + bytes), PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (base == MAP_FAILED) bad(file, std::string("cannot map (") + std::strerror(map_errno) + ")");
  const size_t mapped = static_cast<size_t>(offset + bytes);
  // Read-only pages: nothing writes a data set's inputs (batches are copies made by index).
  return torch::from_blob(static_cast<char*>(base) + offset, shape, [base, mapped](void*) { ::munmap(base, mapped); },
                          at::TensorOptions().dtype(type));
}

}  // namespace pipetrain::job
