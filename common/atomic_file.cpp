#include "common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/error.h"

namespace pipetrain {

namespace {

std::string sys_error(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

}  // namespace

void write_file_synced(const std::string& path, const void* data, size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError(sys_error("cannot create", path));
  const char* bytes = static_cast<const char*>(data);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, bytes + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = ENOSPC;  // a write that makes no progress: the disk is full
      const std::string msg = sys_error("cannot write", path);
      ::close(fd);
      throw IoError(msg);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const std::string msg = sys_error("cannot flush", path);
    ::close(fd);
    throw IoError(msg);
  }
  if (::close(fd) != 0) throw IoError(sys_error("cannot close", path));
}

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw IoError(sys_error("cannot open directory", dir));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw IoError(sys_error("cannot flush directory", dir));
}

void write_file_atomically(const std::string& path, const void* data, size_t size) {
  const std::string partial = path + ".partial";
  try {
    write_file_synced(partial, data, size);
  } catch (const IoError&) {
    std::remove(partial.c_str());  // a full disk keeps no half file
    throw;
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0) {
    const std::string msg = sys_error("cannot rename " + partial + " to", path);
    std::remove(partial.c_str());
    throw IoError(msg);
  }
}

}  // namespace pipetrain
