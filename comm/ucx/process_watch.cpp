// ucx: identity records and pidfds (process_watch.h).
#include "comm/ucx/process_watch.h"

#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>

#include "common/error.h"

namespace pipetrain::comm::ucx {

namespace {

constexpr const char* kMagic = "ptpeer1";

struct Identity {
  std::string boot;       // /proc/sys/kernel/random/boot_id
  std::string pid_ns;     // "device:inode" of /proc/self/ns/pid, "0:0" when unknown
  long pid = 0;
  unsigned long long start = 0;  // clock ticks after boot at which the process started
};

std::string read_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Field 22 of /proc/<pid>/stat, after the command name (which may hold spaces and parentheses).
bool start_time(long pid, unsigned long long* out) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return false;
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream fields(stat.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i)  // fields 3.. follow the name; 22 is the start time
    if (!(fields >> field)) return false;
  char* end = nullptr;
  *out = std::strtoull(field.c_str(), &end, 10);
  return end && *end == '\0' && !field.empty();
}

// Read once per process: a forked child (tests, launchers) reads its own again.
Identity self() {
  static std::mutex mu;
  static Identity cached;
  std::lock_guard<std::mutex> lock(mu);
  if (cached.pid == static_cast<long>(::getpid())) return cached;
  cached = [] {
    Identity i;
    i.boot = read_line("/proc/sys/kernel/random/boot_id");
    struct stat st {};
    i.pid_ns = ::stat("/proc/self/ns/pid", &st) == 0
                   ? std::to_string(static_cast<unsigned long long>(st.st_dev)) + ":" +
                         std::to_string(static_cast<unsigned long long>(st.st_ino))
                   : "0:0";
    i.pid = static_cast<long>(::getpid());
    if (i.boot.size() != 36 || !start_time(i.pid, &i.start)) {
      i.boot = std::string(36, '0');  // unknown: no peer will watch this process
      i.pid_ns = "0:0";
    }
    return i;
  }();
  return cached;
}

// Parses the record at the start of `published`; false when it is not one.
bool parse(const std::string& published, Identity* out) {
  if (published.size() < kIdentityBytes) return false;
  const std::string record = published.substr(0, kIdentityBytes);
  if (record.back() != '\n') return false;
  std::istringstream in(record);
  std::string magic, rest;
  if (!(in >> magic >> out->boot >> out->pid_ns >> out->pid >> out->start) || magic != kMagic) return false;
  if (in >> rest) return false;  // nothing else but padding
  if (out->boot.size() != 36 || out->boot.find_first_not_of("0123456789abcdef-") != std::string::npos)
    return false;
  if (out->pid_ns.find(':') == std::string::npos || out->pid_ns.find_first_not_of("0123456789:") != std::string::npos)
    return false;
  return out->pid > 0;
}

}  // namespace

std::string identity_record() {
  const Identity id = self();
  std::string r = detail::concat(kMagic, ' ', id.boot, ' ', id.pid_ns, ' ', id.pid, ' ', id.start);
  PIPETRAIN_CHECK(r.size() < kIdentityBytes, "identity record too long: " + r);
  r.resize(kIdentityBytes - 1, ' ');
  r.push_back('\n');
  return r;
}

std::string ucx_address_of(const std::string& published, int rank) {
  Identity id;
  if (!parse(published, &id))
    throw TransportError(rank, detail::concat("ucx: the address that rank ", rank,
                                              " published does not start with a process identity"));
  return published.substr(kIdentityBytes);
}

PeerProcess watch_peer(const std::string& published) {
  PeerProcess out;
  const Identity me = self();
  Identity peer;
  if (!parse(published, &peer) || me.pid_ns == "0:0" || peer.boot != me.boot || peer.pid_ns != me.pid_ns)
    return out;  // another host or pid namespace, or this process unknown to itself
  if (peer.pid == me.pid) {
    out.this_process = peer.start == me.start;
    return out;
  }
#ifdef SYS_pidfd_open
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(peer.pid), 0));
  if (fd < 0) return out;
  // The pidfd holds the process it was opened on: if that one started when the record says, it
  // is the peer. Unreadable now: the process has exited already, which the pidfd shows at once.
  unsigned long long start = 0;
  if (start_time(peer.pid, &start) && start != peer.start) {
    ::close(fd);
    return out;
  }
  out.pidfd = fd;
  out.pid = peer.pid;
#endif
  return out;
}

}  // namespace pipetrain::comm::ucx
