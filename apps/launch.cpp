#include "apps/launch.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "comm/rendezvous.h"
#include "common/error.h"
#include "common/log.h"

namespace pipetrain::launch {

namespace {

int g_signal_pipe[2] = {-1, -1};

extern "C" void on_signal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  const int saved = errno;
  (void)!::write(g_signal_pipe[1], &b, 1);
  errno = saved;
}

struct Rank {
  pid_t pid = -1;
  int out = -1, err = -1;  // read ends of the rank's stdout and stderr
  std::string out_buf, err_buf;
  bool running = false;
  int status = 0;      // exit status, 128 + signal when killed
  int stopped_by = 0;  // the signal that stopped the rank (SIGSTOP, SIGTSTP, ...) while it is stopped
};

// Writes complete lines of `buf` with the rank's prefix; `flush` writes a trailing partial line too.
void emit(std::string& buf, FILE* to, int rank, bool flush) {
  size_t start = 0, nl;
  while ((nl = buf.find('\n', start)) != std::string::npos) {
    std::fprintf(to, "[rank %d] %.*s\n", rank, static_cast<int>(nl - start), buf.data() + start);
    start = nl + 1;
  }
  buf.erase(0, start);
  if (flush && !buf.empty()) {
    std::fprintf(to, "[rank %d] %s\n", rank, buf.c_str());
    buf.clear();
  }
  std::fflush(to);
}

// Reads what is there; returns false at end of file.
bool drain(int fd, std::string& buf) {
  char chunk[4096];
  const ssize_t n = ::read(fd, chunk, sizeof chunk);
  if (n > 0) {
    buf.append(chunk, static_cast<size_t>(n));
    return true;
  }
  return n < 0 && (errno == EINTR || errno == EAGAIN);
}

// Where an attempt of the job stands: its number (0: the first start), why the one before it
// ended, and its identity.
struct Attempt {
  int number = 0;
  int nproc = 1;      // ranks this attempt starts (fewer than LaunchOptions::nproc once shrunk)
  std::string cause;  // why the previous attempt ended ("" for the first)
  int port = 0;
  std::string token;
};

void start(Rank& r, int rank, const LaunchOptions& o, const Attempt& attempt) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)
    throw Error(std::string("launch: cannot create pipes: ") + std::strerror(errno));
  std::vector<std::string> args;
  const bool sub = std::find(o.subcommands.begin(), o.subcommands.end(), o.command[0]) != o.subcommands.end();
  if (sub) args.push_back(o.self);
  args.insert(args.end(), o.command.begin(), o.command.end());
  // A restart continues from the latest complete checkpoint (or starts afresh where none is yet).
  if (attempt.number > 0 && sub && o.command[0] == "train" &&
      std::find(o.command.begin(), o.command.end(), "--resume") == o.command.end())
    args.push_back("--resume");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::vector<std::pair<std::string, std::string>> env{
      {"RANK", std::to_string(rank)},          {"WORLD_SIZE", std::to_string(attempt.nproc)},
      {"LOCAL_RANK", std::to_string(rank)},    {"LOCAL_WORLD_SIZE", std::to_string(attempt.nproc)},
      {"MASTER_ADDR", o.master_addr},          {"MASTER_PORT", std::to_string(attempt.port)},
      {"PIPETRAIN_LOG_RANK", "0"},  // the launcher prefixes the ranks' lines itself
      {"PIPETRAIN_RUN_TOKEN", attempt.token},
      {"PIPETRAIN_RESTART", std::to_string(attempt.number)},
      {"PIPETRAIN_RESTART_CAUSE", attempt.cause},
      {"PIPETRAIN_SHRUNK", attempt.nproc < o.nproc ? std::to_string(o.nproc) : ""}};

  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw Error(std::string("launch: fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    // A rank dies with its launcher, even one killed by SIGKILL: SIGTERM when the launcher goes
    // (it then stops after its step, as when the launcher forwards a signal). A launcher that
    // died before this line is seen as a new parent.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != launcher) ::_exit(128 + SIGTERM);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::setpgid(0, 0);  // ^C at the terminal reaches the launcher only; it forwards the signal
    for (const auto& [k, v] : env) {
      if (v.empty() && k == "PIPETRAIN_SHRUNK")
        ::unsetenv(k.c_str());
      else
        ::setenv(k.c_str(), v.c_str(), 1);
    }
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "cannot run %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  r.pid = pid;
  r.out = out[0];
  r.err = err[0];
  r.running = true;
}

void signal_all(std::vector<Rank>& ranks, int sig) {
  for (Rank& r : ranks)
    if (r.running) {
      ::kill(r.pid, sig);
      if (r.stopped_by) ::kill(r.pid, SIGCONT);  // a stopped rank acts on the signal only when continued
    }
}

// "; rank 2 is stopped (SIGSTOP), which is likely why" for every stopped rank but `except`.
std::string stopped_ranks(const std::vector<Rank>& ranks, int except) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i)
    if (static_cast<int>(i) != except && ranks[i].running && ranks[i].stopped_by)
      s += "; rank " + std::to_string(i) + " is stopped (SIG" + sigabbrev_np(ranks[i].stopped_by) + ")";
  return s.empty() ? s : s + ", which is likely why";
}

// How an attempt ended: its exit status for the launcher, and, when a rank failed, which and how.
struct Outcome {
  int result = 0;
  int failed_rank = -1;
  std::string cause;      // "rank 1 was killed by signal 9"
  bool signalled = false; // the launcher was asked to stop (SIGINT, SIGTERM)
};

// Starts every rank and supervises them until all have exited.
Outcome run_attempt(const LaunchOptions& o, const Attempt& attempt) {
  const int nproc = attempt.nproc;
  std::vector<Rank> ranks(nproc);
  for (int i = 0; i < nproc; ++i) start(ranks[i], i, o, attempt);

  Outcome outcome;
  int result = 0, failed_rank = -1;
  using Clock = std::chrono::steady_clock;
  Clock::time_point stop_by{};  // set when the ranks are being stopped: then SIGKILL at this time
  bool killed = false;
  int running = nproc;
  while (running > 0) {
    std::vector<pollfd> fds{{g_signal_pipe[0], POLLIN, 0}};
    std::vector<std::pair<int, bool>> who;  // (rank, is stderr)
    for (int i = 0; i < nproc; ++i) {
      if (ranks[i].out >= 0) fds.push_back({ranks[i].out, POLLIN, 0}), who.emplace_back(i, false);
      if (ranks[i].err >= 0) fds.push_back({ranks[i].err, POLLIN, 0}), who.emplace_back(i, true);
    }
    ::poll(fds.data(), fds.size(), 100);  // the timeout only paces the reaping of exited ranks
    if (fds[0].revents & POLLIN) {
      unsigned char sig = 0;
      while (::read(g_signal_pipe[0], &sig, 1) == 1) {
        log::info(std::string(sig == SIGINT ? "SIGINT" : "SIGTERM") + "; forwarding it to every rank");
        outcome.signalled = true;
        signal_all(ranks, sig);
        if (stop_by == Clock::time_point{}) stop_by = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                                           std::chrono::duration<double>(o.grace_s));
      }
    }
    for (size_t k = 1; k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Rank& r = ranks[who[k - 1].first];
      const bool is_err = who[k - 1].second;
      int& fd = is_err ? r.err : r.out;
      std::string& buf = is_err ? r.err_buf : r.out_buf;
      const bool open = drain(fd, buf);
      emit(buf, is_err ? stderr : stdout, who[k - 1].first, !open);
      if (!open) {
        ::close(fd);
        fd = -1;
      }
    }
    // Reap exited ranks; the first failure stops the others.
    for (int i = 0; i < nproc; ++i) {
      Rank& r = ranks[i];
      if (!r.running) continue;
      int st = 0;
      if (::waitpid(r.pid, &st, WNOHANG | WUNTRACED | WCONTINUED) != r.pid) continue;
      if (WIFSTOPPED(st)) {
        r.stopped_by = WSTOPSIG(st);
        log::warning(detail::concat("rank ", i, " was stopped by SIG", sigabbrev_np(r.stopped_by)));
        continue;
      }
      if (WIFCONTINUED(st)) {
        if (r.stopped_by) log::info(detail::concat("rank ", i, " continues"));
        r.stopped_by = 0;
        continue;
      }
      r.running = false;
      --running;
      r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      if (r.status != 0 && failed_rank < 0 && stop_by == Clock::time_point{}) {
        failed_rank = i;
        result = r.status;
        outcome.cause = detail::concat("rank ", i, WIFEXITED(st) ? " exited with status " : " was killed by signal ",
                                       WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
        if (running > 0)
          log::error(detail::concat("rank ", i, WIFEXITED(st) ? " exited with status " : " was killed by signal ",
                                    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), stopped_ranks(ranks, i),
                                    "; stopping the other ranks"));
        signal_all(ranks, SIGTERM);
        stop_by = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.grace_s));
      } else if (r.status != 0 && result == 0) {
        result = r.status;
        failed_rank = i;
      }
    }
    if (!killed && stop_by != Clock::time_point{} && Clock::now() >= stop_by && running > 0) {
      log::warning(detail::concat(running, " rank(s) still running after ", static_cast<long>(o.grace_s + 0.5),
                                  " s; killing them"));
      signal_all(ranks, SIGKILL);
      killed = true;
    }
  }
  // Output still buffered in the pipes of exited ranks.
  for (int i = 0; i < nproc; ++i) {
    for (bool is_err : {false, true}) {
      int& fd = is_err ? ranks[i].err : ranks[i].out;
      std::string& buf = is_err ? ranks[i].err_buf : ranks[i].out_buf;
      if (fd >= 0) {
        ::fcntl(fd, F_SETFL, O_NONBLOCK);
        char chunk[4096];
        ssize_t n;
        for (int guard = 0; guard < 4096 && (n = ::read(fd, chunk, sizeof chunk)) > 0; ++guard)
          buf.append(chunk, static_cast<size_t>(n));
        ::close(fd);
        fd = -1;
      }
      emit(buf, is_err ? stderr : stdout, i, true);
    }
  }
  outcome.result = result;
  outcome.failed_rank = failed_rank;
  if (failed_rank >= 0 && outcome.cause.empty())
    outcome.cause = detail::concat("rank ", failed_rank, " failed (status ", result, ")");
  return outcome;
}

}  // namespace

int run(const LaunchOptions& o) {
  log::set_name("pipetrain launch");
  if (o.nproc < 1) throw ConfigError("--nproc: must be at least 1");
  if (o.command.empty()) throw ConfigError("launch: no command after --, e.g. pipetrain launch --nproc 2 -- train CONFIG");
  if (o.master_port < 0 || o.master_port > 65535) throw ConfigError("--master-port: not a TCP port");
  if (o.max_restarts < 0) throw ConfigError("--max-restarts: must be zero or more");
  if (o.min_nproc < 0 || o.min_nproc > o.nproc)
    throw ConfigError(detail::concat("--min-nproc: must be between 1 and --nproc (", o.nproc, "), got ", o.min_nproc));

  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
    throw Error(std::string("launch: cannot create a pipe: ") + std::strerror(errno));
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int {}, old_term {};
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);

  Outcome outcome;
  Attempt attempt;
  attempt.nproc = o.nproc;
  int failed_before = -1;  // the rank that failed first in the attempt before, if any
  for (;; ++attempt.number) {
    // Each attempt is a job of its own: a fresh port (unless given) and run token, so that a
    // straggler of the attempt before cannot join this one (comm/rendezvous.h).
    attempt.port = o.master_port ? o.master_port : comm::free_loopback_port();
    char token[96];
    std::snprintf(token, sizeof token, "launch:%d:%d:%d:%llx", static_cast<int>(::getpid()), attempt.port,
                  attempt.number,
                  static_cast<unsigned long long>(std::chrono::steady_clock::now().time_since_epoch().count()));
    attempt.token = token;
    outcome = run_attempt(o, attempt);
    if (outcome.result == 0 || outcome.signalled) break;
    if (outcome.result == 2 && attempt.number < o.max_restarts) {
      log::error(detail::concat("not restarting: ", outcome.cause,
                                ", a usage or configuration error, which a restart would repeat"));
      break;
    }
    if (attempt.number >= o.max_restarts) break;
    attempt.cause = outcome.cause;
    std::string shrink;
    if (o.min_nproc > 0 && outcome.failed_rank >= 0 && outcome.failed_rank == failed_before &&
        attempt.nproc - 1 >= o.min_nproc) {
      // The same rank failed first twice in a row: its slot is gone for good; go on without it.
      --attempt.nproc;
      shrink = detail::concat("; rank ", outcome.failed_rank, " failed first twice in a row, so its slot is taken as "
                              "gone: continuing on ", attempt.nproc, " ranks (--min-nproc ", o.min_nproc, ")");
      attempt.cause += detail::concat("; shrunk to ", attempt.nproc, " ranks");
      failed_before = -1;
    } else {
      failed_before = outcome.failed_rank;
    }
    log::warning(detail::concat("restart ", attempt.number + 1, " of at most ", o.max_restarts, ": ", outcome.cause,
                                shrink, "; starting every rank again from the latest complete checkpoint"));
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  ::close(g_signal_pipe[0]);
  ::close(g_signal_pipe[1]);
  if (outcome.failed_rank >= 0 && outcome.result != 0)
    log::error(detail::concat("rank ", outcome.failed_rank, " failed (status ", outcome.result, ")",
                              attempt.number > 0 ? detail::concat(" after ", attempt.number, " restart",
                                                                  attempt.number == 1 ? "" : "s")
                                                 : ""));
  return outcome.result;
}

}  // namespace pipetrain::launch
