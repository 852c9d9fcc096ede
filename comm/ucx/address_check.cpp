// ucx: peer addresses unpacked by UCX in a disposable process before this rank's worker takes
// them (comm/ucx/internal.h, AddressCheck). A worker address is UCX's own packed format, which
// UCX does not validate: a malformed one fails an assertion inside ucp_address_unpack and aborts
// the process. The address record (comm/address_record.h) catches damage, but any client of the
// rendezvous store may write a well-formed record around a forged address; so a child process
// makes its own context and worker, creates an endpoint from every peer's address (the same
// unpacking), and reports which address, if any, it could not take. The child is this program
// again (/proc/self/exe), not a bare fork: a fork copies no other thread, and a lock another
// thread held at the fork (UCX's memory hooks, its progress thread's) would stay held in the
// child for ever. A static initializer below sees PIPETRAIN_UCX_ADDRESS_CHECK and runs the check
// before anything else of the program; it waits for the addresses on a pipe, closes its
// endpoints without sending on them and exits; a crash names the address it was unpacking. A
// system where the program cannot run itself again skips the check, saying so.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <ucp/api/ucp.h>

#include "comm/ucx/internal.h"
#include "common/error.h"
#include "common/log.h"

extern char** environ;

namespace pipetrain::comm::ucx {

namespace {

constexpr double kCheckSeconds = 30;  // bound on the check: context, worker, an endpoint per peer

void say(int fd, const std::string& line) { (void)!::write(fd, line.data(), line.size()); }

bool read_all(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// The child: waits for "self, count, then each address as its length and bytes"; says "checking
// R\n" before each address, "bad R STATUS\n" for one UCX refused, "ok\n" at the end. A parent
// that closes the pipe without sending ends it.
[[noreturn]] void child(int in, int out) {
  uint32_t self = 0, count = 0;
  if (!read_all(in, &self, sizeof self) || !read_all(in, &count, sizeof count) || count > (1u << 16)) ::_exit(0);
  std::vector<std::string> addresses(count);
  for (auto& a : addresses) {
    uint32_t n = 0;
    if (!read_all(in, &n, sizeof n) || n > (1u << 20)) ::_exit(0);
    a.resize(n);
    if (n && !read_all(in, a.data(), n)) ::_exit(0);
  }
  ::alarm(static_cast<unsigned>(kCheckSeconds));
  // UCX's messages (an endpoint it could not create: "select.c:721 UCX ERROR no active messages
  // transport ...", on the stdout it shares with its parent) and its report of a crash (a
  // backtrace, on stderr) are not for the user: the parent says what failed, in one line.
  silence_ucx_log();
  const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (null >= 0) {
    ::dup2(null, STDOUT_FILENO);
    ::dup2(null, STDERR_FILENO);
  }
  ucp_config_t* config = nullptr;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) ::_exit(3);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG;
  const ucs_status_t init = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (init != UCS_OK) ::_exit(3);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  if (ucp_worker_create(context, &wp, &worker) != UCS_OK) ::_exit(3);
  for (size_t r = 0; r < addresses.size(); ++r) {
    if (r == self) continue;
    say(out, "checking " + std::to_string(r) + "\n");
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep.address = reinterpret_cast<const ucp_address_t*>(addresses[r].data());
    ucp_ep_h handle = nullptr;
    const ucs_status_t st = ucp_ep_create(worker, &ep, &handle);
    if (st != UCS_OK) {
      say(out, "bad " + std::to_string(r) + " " + ucs_status_string(st) + "\n");
      ::_exit(0);
    }
    ucp_ep_destroy(handle);
  }
  say(out, "ok\n");
  ::_exit(0);  // no teardown: nothing of it outlives the process
}

constexpr const char* kChildVariable = "PIPETRAIN_UCX_ADDRESS_CHECK";

// The checking process is this program run again with kChildVariable=IN,OUT: it checks and exits
// here, before main().
struct ChildEntry {
  ChildEntry() {
    const char* fds = std::getenv(kChildVariable);
    if (!fds) return;
    int in = -1, out = -1;
    if (std::sscanf(fds, "%d,%d", &in, &out) != 2 || in < 0 || out < 0) ::_exit(2);
    child(in, out);
  }
} child_entry;

}  // namespace

AddressCheck::AddressCheck() {
  int to[2], from[2];
  if (::pipe2(to, O_CLOEXEC) != 0) throw Error(detail::concat("ucx: pipe: ", std::strerror(errno)));
  if (::pipe2(from, O_CLOEXEC) != 0) {
    ::close(to[0]);
    ::close(to[1]);
    throw Error(detail::concat("ucx: pipe: ", std::strerror(errno)));
  }
  // Everything the child needs before exec is made here: between fork and exec only
  // async-signal-safe calls.
  const std::string variable = detail::concat(kChildVariable, "=", to[0], ",", from[1]);
  std::vector<char*> env;
  for (char** e = environ; e && *e; ++e)
    if (std::strncmp(*e, kChildVariable, std::strlen(kChildVariable)) != 0) env.push_back(*e);
  env.push_back(const_cast<char*>(variable.c_str()));
  env.push_back(nullptr);
  char name[] = "pipetrain-ucx-address-check";
  char* argv[] = {name, nullptr};
  pid_ = ::fork();
  if (pid_ < 0) {
    for (int fd : {to[0], to[1], from[0], from[1]}) ::close(fd);
    throw Error(detail::concat("ucx: fork: ", std::strerror(errno)));
  }
  if (pid_ == 0) {
    ::fcntl(to[0], F_SETFD, 0);  // these two survive the exec
    ::fcntl(from[1], F_SETFD, 0);
    ::execve("/proc/self/exe", argv, env.data());
    ::_exit(127);
  }
  ::close(to[0]);
  ::close(from[1]);
  to_child_ = to[1];
  from_child_ = from[0];
}

AddressCheck::~AddressCheck() {
  if (to_child_ >= 0) ::close(to_child_);  // an unused child reads the end and exits
  if (from_child_ >= 0) ::close(from_child_);
  if (pid_ > 0) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) != pid_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
    }
  }
}

void AddressCheck::check(const std::vector<std::string>& addresses, int self) {
  std::string request;
  const auto put = [&](uint32_t v) { request.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(static_cast<uint32_t>(self));
  put(static_cast<uint32_t>(addresses.size()));
  for (const auto& a : addresses) {
    put(static_cast<uint32_t>(a.size()));
    request += a;
  }
  const bool sent = write_all(to_child_, request.data(), request.size());
  ::close(to_child_);
  to_child_ = -1;
  std::string out;
  const Deadline deadline = Deadline::after(kCheckSeconds + 5);
  for (;;) {  // until the child closes the pipe (it exits), bounded by the deadline
    pollfd p{from_child_, POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.at - Clock::now()).count();
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(std::max<int64_t>(1, left))) == 0) break;
    char buf[256];
    const ssize_t n = ::read(from_child_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) != pid_) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
  }
  pid_ = -1;
  if (out.size() >= 3 && out.compare(out.size() - 3, 3, "ok\n") == 0) return;
  if (out.empty() && WIFEXITED(status) && WEXITSTATUS(status) == 127) {
    log::warning(detail::concat("rank ", self, ": cannot run this program again (/proc/self/exe) to check the peers' "
                                "UCX worker addresses; UCX unpacks them unchecked"));
    return;
  }
  // The rank whose address was being unpacked when the child stopped.
  int peer = -1;
  std::string status_text;
  for (size_t at = 0; at < out.size();) {
    const size_t nl = out.find('\n', at);
    const std::string line = out.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
    if (line.rfind("checking ", 0) == 0) peer = std::atoi(line.c_str() + 9);
    if (line.rfind("bad ", 0) == 0) {
      peer = std::atoi(line.c_str() + 4);
      status_text = line.substr(line.find(' ', 4) + 1);
    }
    if (nl == std::string::npos) break;
    at = nl + 1;
  }
  const std::string how = !status_text.empty() ? "UCX refused it: " + status_text
                          : WIFSIGNALED(status)
                              ? detail::concat("unpacking it crashed UCX (signal ", WTERMSIG(status), ")")
                              : "the check did not finish";
  if (peer < 0)
    throw TransportError(-1, detail::concat("rank ", self, ": cannot check the peers' UCX worker addresses (",
                                            !sent ? "the checking process is gone"
                                            : out.empty() ? "UCX did not start in the checking process"
                                                          : how,
                                            ")"));
  throw TransportError(peer, detail::concat("rank ", self, ": the UCX worker address that rank ", peer,
                                            " published is not one UCX can use (", how,
                                            "): the rendezvous store's record was forged or damaged"));
}

}  // namespace pipetrain::comm::ucx
