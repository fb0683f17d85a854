// `cqk launch --nproc N -- train ARGS...`: starts N local ranks of this same
// binary with the environment torchrun gives its workers, passes rank 0's
// output through as it is and prefixes every line of the other ranks with
// "[rank i] ", and waits for all of them. When a rank fails, the others get a
// grace period to notice (their collectives fail or time out) and exit on
// their own; whatever still runs after it is stopped (SIGTERM, then SIGKILL).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.h"
#include "cqk/runtime.h"

extern char** environ;

namespace cqk::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct LaunchArguments {
  int nproc = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  double grace_seconds = 30.0;
  double timeout_seconds = 0.0;
  std::vector<std::string> command;
};

std::atomic<int> g_launcher_signal{0};
extern "C" void launcher_signal(int signal) { g_launcher_signal.store(signal); }

// A port that was free a moment ago on loopback (rank 0's store binds it right after).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("launch: socket: ") + std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const std::string error = std::strerror(errno);
    ::close(fd);
    throw std::runtime_error("launch: cannot find a free port: " + error);
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

std::string self_executable() {
  std::vector<char> buffer(4096);
  const ssize_t n = ::readlink("/proc/self/exe", buffer.data(), buffer.size() - 1);
  if (n <= 0)
    throw std::runtime_error(std::string("launch: cannot find this program (/proc/self/exe): ") + std::strerror(errno));
  return std::string(buffer.data(), static_cast<size_t>(n));
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    return "killed by signal " + std::to_string(signal) + " (" + ::strsignal(signal) + ")";
  }
  return "status " + std::to_string(status);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

void say(const std::string& message) { write_all(STDERR_FILENO, "cqk launch: " + message + "\n"); }

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  bool stopped_by_launcher = false;
  int status = 0;
};

// One output stream of a prefixed rank: complete lines go out with the prefix.
struct Stream {
  int fd = -1;     // read end of the pipe
  int target = 1;  // STDOUT_FILENO or STDERR_FILENO
  std::string prefix;
  std::string pending;

  void flush_lines(bool everything) {
    size_t start = 0;
    for (size_t end; (end = pending.find('\n', start)) != std::string::npos; start = end + 1)
      write_all(target, prefix + pending.substr(start, end - start + 1));
    pending.erase(0, start);
    if (everything && !pending.empty()) {
      write_all(target, prefix + pending + "\n");
      pending.clear();
    }
  }
};

// The free port of a one-node launch without --master-port, after checking the arguments.
int checked_port(const LaunchArguments& args) {
  if (args.command.empty())
    throw std::invalid_argument("launch: give the command for each rank after --, e.g. cqk launch --nproc 2 -- train");
  if (args.command.front() == "launch") throw std::invalid_argument("launch: the ranks cannot run `cqk launch` again");
  if (args.node_rank >= args.nnodes)
    throw std::invalid_argument("launch: --node-rank must be below --nnodes (" + std::to_string(args.nnodes) + ")");
  // The other nodes would wait for a store on their own loopback until the timeout.
  if (args.nnodes > 1 && (args.master_addr == "127.0.0.1" || args.master_addr == "localhost"))
    throw std::invalid_argument("launch: --master-addr must be node 0's address, reachable from every node, with "
                                "--nnodes > 1 (got " + args.master_addr + ")");
  if (args.master_port != 0) return args.master_port;
  if (args.nnodes > 1) throw std::invalid_argument("launch: --master-port is required with --nnodes > 1");
  return free_port();
}

// What every rank's environment sets, as torchrun does (RANK and LOCAL_RANK come per rank).
std::map<std::string, std::string> common_environment(const LaunchArguments& args, int port) {
  const char* threads_env = std::getenv("CQK_NUM_THREADS");
  const std::string threads =
      threads_env && *threads_env ? threads_env : std::to_string(std::max(1, available_cpus() / args.nproc));
  std::map<std::string, std::string> common = {{"WORLD_SIZE", std::to_string(args.nnodes * args.nproc)},
                                               {"LOCAL_WORLD_SIZE", std::to_string(args.nproc)},
                                               {"MASTER_ADDR", args.master_addr},
                                               {"MASTER_PORT", std::to_string(port)},
                                               {"GROUP_RANK", std::to_string(args.node_rank)},
                                               {"CQK_NUM_THREADS", threads}};
  if (args.timeout_seconds > 0) common["CQK_DIST_TIMEOUT"] = std::to_string(args.timeout_seconds);
  if (!std::getenv("OMP_NUM_THREADS")) common["OMP_NUM_THREADS"] = threads;
  return common;
}

// SIGINT and SIGTERM reach the launcher's flag while it lives; the ranks get
// the handlers the launcher started with.
class LauncherSignals {
 public:
  LauncherSignals() {
    struct sigaction action {};
    action.sa_handler = launcher_signal;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGINT, &action, &previous_int_);
    ::sigaction(SIGTERM, &action, &previous_term_);
  }
  ~LauncherSignals() { restore(); }
  LauncherSignals(const LauncherSignals&) = delete;
  LauncherSignals& operator=(const LauncherSignals&) = delete;
  void restore() const {  // also in a forked child, before exec
    ::sigaction(SIGINT, &previous_int_, nullptr);
    ::sigaction(SIGTERM, &previous_term_, nullptr);
  }

 private:
  struct sigaction previous_int_ {}, previous_term_{};
};

// Forks and execs local rank `local` with `common` plus its RANK and
// LOCAL_RANK. Ranks other than 0 write into pipes that are added to `streams`.
// Everything the child needs is built before fork: the child only calls exec.
Rank start_rank(const LaunchArguments& args, int local, const std::map<std::string, std::string>& common,
                const LauncherSignals& signals, std::vector<Stream>& streams) {
  const int rank = args.node_rank * args.nproc + local;
  const std::string exe = self_executable();
  std::vector<std::string> argv_storage{exe};
  argv_storage.insert(argv_storage.end(), args.command.begin(), args.command.end());
  std::vector<char*> child_argv;
  for (auto& a : argv_storage) child_argv.push_back(a.data());
  child_argv.push_back(nullptr);

  auto variables = common;
  variables["RANK"] = std::to_string(rank);
  variables["LOCAL_RANK"] = std::to_string(local);
  std::vector<std::string> env_storage;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    if (variables.count(entry.substr(0, entry.find('='))) == 0) env_storage.push_back(entry);
  }
  for (const auto& [key, value] : variables) env_storage.push_back(key + "=" + value);
  std::vector<char*> child_env;
  for (auto& e : env_storage) child_env.push_back(e.data());
  child_env.push_back(nullptr);

  const bool prefixed = rank != 0;
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  if (prefixed && (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0))
    throw std::runtime_error(std::string("launch: pipe: ") + std::strerror(errno));
  std::fflush(nullptr);
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("launch: fork: ") + std::strerror(errno));
  if (pid == 0) {
    signals.restore();
    // A launcher killed outright (SIGKILL, the OOM killer) stops its ranks as a scheduler would:
    // SIGTERM, so they checkpoint. The second check covers a launcher that died before prctl.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != launcher) ::_exit(143);
    if (prefixed) {
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
    }
    ::execve(exe.c_str(), child_argv.data(), child_env.data());
    const std::string message = "cqk launch: cannot run " + exe + ": " + std::strerror(errno) + "\n";
    write_all(STDERR_FILENO, message);
    ::_exit(127);
  }
  if (prefixed) {
    ::close(out[1]);
    ::close(err[1]);
    const std::string prefix = "[rank " + std::to_string(rank) + "] ";
    streams.push_back({out[0], STDOUT_FILENO, prefix, {}});
    streams.push_back({err[0], STDERR_FILENO, prefix, {}});
  }
  return {rank, pid, true, false, 0};
}

// Watches the ranks until all have exited and their output is drained: passes
// their output on, notes the first failure, forwards the launcher's signals,
// and stops what still runs a grace period after a failure.
class Supervisor {
 public:
  Supervisor(std::vector<Rank>& ranks, std::vector<Stream>& streams, double grace_seconds)
      : ranks_(ranks), streams_(streams), grace_seconds_(grace_seconds), running_(static_cast<int>(ranks.size())) {}

  void run() {
    while (!done()) {
      pump_output();
      reap_exited();
      forward_signals();
      stop_after_grace();
    }
    for (auto& s : streams_)
      if (s.fd >= 0) {
        s.flush_lines(true);
        ::close(s.fd);
      }
  }

  const Rank* first_failure() const { return first_failure_; }
  bool interrupted() const { return interrupted_; }  // the launcher got SIGINT/SIGTERM: exits are not failures

 private:
  bool done() const {
    const bool output_open = std::any_of(streams_.begin(), streams_.end(), [](const Stream& s) { return s.fd >= 0; });
    return running_ == 0 && (!output_open || (all_exited_ && Clock::now() - *all_exited_ > std::chrono::seconds(2)));
  }

  void pump_output() {
    std::vector<pollfd> fds;
    for (auto& s : streams_)
      if (s.fd >= 0) fds.push_back({s.fd, POLLIN, 0});
    if (fds.empty()) {
      ::usleep(100 * 1000);
      return;
    }
    ::poll(fds.data(), fds.size(), 100);
    for (auto& s : streams_) {
      if (s.fd < 0) continue;
      for (const auto& p : fds) {
        if (p.fd != s.fd || (p.revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        char buffer[8192];
        const ssize_t n = ::read(s.fd, buffer, sizeof buffer);
        if (n > 0) {
          s.pending.append(buffer, static_cast<size_t>(n));
          s.flush_lines(false);
        } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
          s.flush_lines(true);
          ::close(s.fd);
          s.fd = -1;
        }
      }
    }
  }

  void reap_exited() {
    for (auto& r : ranks_) {
      if (!r.running) continue;
      int status = 0;
      if (::waitpid(r.pid, &status, WNOHANG) != r.pid) continue;
      r.running = false;
      r.status = status;
      if (--running_ == 0) all_exited_ = Clock::now();
      if (status == 0 || first_failure_ != nullptr || r.stopped_by_launcher || interrupted_) continue;
      first_failure_ = &r;
      failure_time_ = Clock::now();
      if (running_ > 0) {
        char grace[32];
        std::snprintf(grace, sizeof grace, "%g", grace_seconds_);
        say("rank " + std::to_string(r.rank) + " failed (" + describe_status(status) + "); waiting up to " + grace +
            " s for the other ranks to exit");
      }
    }
  }

  // Signals to the launcher go to every rank (they checkpoint and exit together).
  void forward_signals() {
    if (const int signal = g_launcher_signal.exchange(0); signal != 0) {
      interrupted_ = true;
      signal_running(signal);
    }
  }

  // After a failure and the grace period: SIGTERM, then SIGKILL 5 s later.
  void stop_after_grace() {
    if (first_failure_ == nullptr || running_ == 0) return;
    const auto now = Clock::now();
    if (!term_sent_ && now - failure_time_ > std::chrono::duration<double>(grace_seconds_)) {
      say("stopping the ranks still running " + std::to_string(static_cast<int>(grace_seconds_)) + " s after rank " +
          std::to_string(first_failure_->rank) + " failed");
      for (auto& r : ranks_) r.stopped_by_launcher = r.running;
      signal_running(SIGTERM);
      term_sent_ = true;
      term_time_ = now;
    } else if (term_sent_ && !kill_sent_ && now - term_time_ > std::chrono::seconds(5)) {
      signal_running(SIGKILL);
      kill_sent_ = true;
    }
  }

  void signal_running(int signal) {
    for (auto& r : ranks_)
      if (r.running) ::kill(r.pid, signal);
  }

  std::vector<Rank>& ranks_;
  std::vector<Stream>& streams_;
  double grace_seconds_;
  int running_;
  const Rank* first_failure_ = nullptr;
  Clock::time_point failure_time_, term_time_;
  bool term_sent_ = false, kill_sent_ = false, interrupted_ = false;
  std::optional<Clock::time_point> all_exited_;
};

// The launcher's exit status: 0 when every rank succeeded; after an interrupt
// the ranks' own status (130: they checkpointed and stopped); else the first
// failure's, with a line for each rank that failed.
int launch_exit_status(const std::vector<Rank>& ranks, const Supervisor& supervisor) {
  int failed = 0;
  for (const auto& r : ranks) {
    if (r.status == 0) continue;
    ++failed;
    say("rank " + std::to_string(r.rank) + " " + (r.stopped_by_launcher ? "was stopped by the launcher: " : "ended: ") +
        describe_status(r.status));
  }
  if (failed == 0) return 0;
  if (supervisor.first_failure() == nullptr && supervisor.interrupted()) {
    for (const auto& r : ranks)
      if (r.status != 0) return exit_code_of(r.status);
  }
  const Rank& first = supervisor.first_failure() != nullptr ? *supervisor.first_failure() : ranks.front();
  say(std::to_string(failed) + " of " + std::to_string(ranks.size()) + " ranks failed; the first was rank " +
      std::to_string(first.rank) + " (" + describe_status(first.status) + ")");
  const int code = exit_code_of(first.status);
  return code == 0 ? 1 : code;
}

int run_launch(const LaunchArguments& args) {
  const int port = checked_port(args);
  const auto common = common_environment(args, port);
  say("starting " + std::to_string(args.nproc) + " rank" + (args.nproc > 1 ? "s" : "") + " of " +
      common.at("WORLD_SIZE") + ", store " + args.master_addr + ":" + std::to_string(port));
  const LauncherSignals signals;
  std::vector<Rank> ranks;
  std::vector<Stream> streams;
  for (int local = 0; local < args.nproc; ++local) ranks.push_back(start_rank(args, local, common, signals, streams));
  Supervisor supervisor(ranks, streams, args.grace_seconds);
  supervisor.run();
  return launch_exit_status(ranks, supervisor);
}

}  // namespace

void add_launch_command(CLI::App& app) {
  auto args = std::make_shared<LaunchArguments>();
  auto* launch = app.add_subcommand(
      "launch", "Run N local ranks of a data-parallel command, e.g. cqk launch --nproc 2 -- train config.yaml");
  launch->add_option("--nproc", args->nproc, "Ranks on this node (one per GPU, or CPU processes)")
      ->required()
      ->check(CLI::Range(1, 1024));
  launch->add_option("--nnodes", args->nnodes, "Nodes in the job (each runs its own cqk launch)")
      ->check(CLI::Range(1, 65536));
  launch->add_option("--node-rank", args->node_rank, "This node's index, 0 .. nnodes-1")->check(non_negative_number());
  launch->add_option("--master-addr", args->master_addr, "Host of rank 0, which serves the rendezvous store")
      ->capture_default_str();
  launch->add_option("--master-port", args->master_port, "Port of the rendezvous store (default: a free port)")
      ->check(CLI::Range(0, 65535));
  launch
      ->add_option("--grace", args->grace_seconds,
                   "Seconds the other ranks get to exit after one fails, before they are stopped")
      ->capture_default_str()
      ->check(non_negative_number());
  launch
      ->add_option("--timeout", args->timeout_seconds,
                   "Collective and rendezvous timeout in seconds for the ranks (sets CQK_DIST_TIMEOUT; default 300)")
      ->check(positive_number());
  launch->add_option("command", args->command, "The cqk command of every rank, after --, e.g. -- train config.yaml")
      ->expected(-1);
  launch->callback([args] { exit_status() = run_launch(*args); });
}

}  // namespace cqk::cli
