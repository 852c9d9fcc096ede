// ucx: peer addresses unpacked by UCX in a disposable process before this rank's worker takes
// them (comm/ucx/internal.h, check_peer_addresses). A worker address is UCX's own packed format,
// which UCX does not validate: a malformed one fails an assertion inside ucp_address_unpack and
// aborts the process. The address record (comm/address_record.h) catches damage, but any client
// of the rendezvous store may write a well-formed record around a forged address; so a child
// process makes its own context and worker, creates an endpoint from every peer's address (the
// same unpacking), and reports which address, if any, it could not take. The child closes its
// endpoints without sending on them and exits; a crash names the address it was unpacking.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include <ucp/api/ucp.h>

#include "comm/ucx/internal.h"
#include "common/error.h"

namespace pipetrain::comm::ucx {

namespace {

constexpr double kCheckSeconds = 30;  // bound on the child: context, worker, an endpoint per peer

void say(int fd, const std::string& line) { (void)!::write(fd, line.data(), line.size()); }

// The child: "checking R\n" before each address, "bad R STATUS\n" for one UCX refused, "ok\n" at the end.
[[noreturn]] void child(int fd, const std::vector<std::string>& addresses, int self) {
  ::alarm(static_cast<unsigned>(kCheckSeconds));
  // UCX's own report of a crash (a backtrace) is not for the user: the parent says what failed.
  const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (null >= 0) ::dup2(null, STDERR_FILENO);
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
    if (static_cast<int>(r) == self) continue;
    say(fd, "checking " + std::to_string(r) + "\n");
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep.address = reinterpret_cast<const ucp_address_t*>(addresses[r].data());
    ucp_ep_h handle = nullptr;
    const ucs_status_t st = ucp_ep_create(worker, &ep, &handle);
    if (st != UCS_OK) {
      say(fd, "bad " + std::to_string(r) + " " + ucs_status_string(st) + "\n");
      ::_exit(0);
    }
    ucp_ep_destroy(handle);
  }
  say(fd, "ok\n");
  ::_exit(0);  // no teardown: the parent's UCX state, copied by fork, is not this child's to close
}

}  // namespace

void check_peer_addresses(const std::vector<std::string>& addresses, int self) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw Error(detail::concat("ucx: rank ", self, ": pipe: ", std::strerror(errno)));
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw Error(detail::concat("ucx: rank ", self, ": fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    ::close(fds[0]);
    child(fds[1], addresses, self);
  }
  ::close(fds[1]);
  std::string out;
  const Deadline deadline = Deadline::after(kCheckSeconds + 5);
  for (;;) {  // until the child closes the pipe (it exits), bounded by the deadline
    pollfd p{fds[0], POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.at - Clock::now()).count();
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(std::max<int64_t>(1, left))) == 0) break;
    char buf[256];
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  if (::waitpid(pid, &status, WNOHANG) != pid) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  if (out.size() >= 3 && out.compare(out.size() - 3, 3, "ok\n") == 0) return;
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
                                            out.empty() ? "UCX did not start in the checking process" : how, ")"));
  throw TransportError(peer, detail::concat("rank ", self, ": the UCX worker address that rank ", peer,
                                            " published is not one UCX can use (", how,
                                            "): the rendezvous store's record was forged or damaged"));
}

}  // namespace pipetrain::comm::ucx
