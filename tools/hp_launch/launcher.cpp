#include "tools/hp_launch/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iostream>
#include <random>
#include <system_error>
#include <utility>

extern char** environ;

namespace hp::launch {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kGracePeriod = std::chrono::seconds(5);
// After SIGKILL only a process stuck in the kernel can survive; the job must still end.
constexpr auto kKillWait = std::chrono::seconds(2);
// A worker's leftover children may hold its pipes open after it was reaped.
constexpr auto kDrainWait = std::chrono::milliseconds(500);
constexpr int kMultiNodeDefaultPort = 29500;
// A worker that never prints a newline must not make the launcher grow without bound.
constexpr size_t kMaxLineBytes = 64 * 1024;
constexpr int kHandledSignals[] = {SIGINT, SIGTERM, SIGCHLD};

std::string signal_name(int sig) {
  static const std::pair<int, const char*> kNames[] = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
      {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGXCPU, "SIGXCPU"}};
  for (const auto& [number, name] : kNames) {
    if (number == sig) return name;
  }
  return "SIG" + std::to_string(sig);
}

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // Nowhere left to report to; the workers' fate does not depend on it.
    done += static_cast<size_t>(n);
  }
}

void say(const std::string& message) { write_all(STDERR_FILENO, "hp-launch: " + message + "\n"); }

int usable_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 1;
}

/// Whether `port` on 127.0.0.1 can be bound now (0: the kernel picks one;
/// `got` gets the port bound).
bool bindable(int port, int& got) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int err = errno;
  ::close(fd);
  if (ok) got = ntohs(addr.sin_port);
  errno = err;
  return ok;
}

/// A port free on 127.0.0.1 now, below the kernel's ephemeral range when
/// there is room (a port the kernel hands out can be taken by another
/// process's outgoing connection between this probe and the store's bind;
/// tests running side by side open many), else the kernel's pick.
int pick_free_port() {
  int low = 32768;
  if (std::FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d", &low) != 1) low = 32768;
    std::fclose(f);
  }
  if (low > 12000) {
    std::mt19937 pick(static_cast<std::uint32_t>(std::random_device{}() ^ static_cast<std::uint32_t>(::getpid())));
    std::uniform_int_distribution<int> in_range(10000, low - 1);
    for (int attempt = 0; attempt < 200; ++attempt) {
      int got = 0;
      if (bindable(in_range(pick), got)) return got;
    }
  }
  int got = 0;
  if (!bindable(0, got)) {
    throw std::system_error(errno, std::generic_category(), "finding a free port on 127.0.0.1");
  }
  return got;
}

// Done before fork because a child of a multi-threaded host (hp-train) may only make
// async-signal-safe calls, which rules out execvp's own PATH search.
std::vector<std::string> exec_candidates(const std::string& program) {
  if (program.find('/') != std::string::npos) return {program};
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/bin:/usr/bin";
  std::vector<std::string> out;
  size_t begin = 0;
  while (true) {
    size_t end = dirs.find(':', begin);
    std::string dir = dirs.substr(begin, end == std::string::npos ? end : end - begin);
    out.push_back((dir.empty() ? "." : dir) + "/" + program);
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  return out;
}

std::vector<std::string> worker_environment(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<std::string> env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string text = *entry;
    std::string key = text.substr(0, text.find('='));
    bool replaced = std::any_of(overrides.begin(), overrides.end(),
                                [&](const auto& kv) { return kv.first == key; });
    if (!replaced) env.push_back(std::move(text));
  }
  for (const auto& [key, value] : overrides) env.push_back(key + "=" + value);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Whether a worker may be a plain fork of this process (LaunchOptions::
// in_process): one thread here (else the child could only exec), and not
// turned off with HP_LAUNCH_EXEC=1.
bool fork_workers(const LaunchOptions& o) {
  if (!o.in_process) return false;
  if (const char* v = std::getenv("HP_LAUNCH_EXEC"); v != nullptr && std::string(v) == "1") return false;
  std::error_code ec;
  int threads = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/task", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++threads;
  }
  return !ec && threads == 1;
}

// In a forked worker that does not exec: what exec would do to the
// descriptors (close those marked close-on-exec: the other workers' pipes,
// the signal pipe) and the environment it would have got.
void become_worker(const std::vector<std::string>& env) {
  std::vector<int> close_on_exec;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const int fd = std::atoi(it->path().filename().c_str());
    if (fd > STDERR_FILENO && (::fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0) close_on_exec.push_back(fd);
  }
  for (int fd : close_on_exec) ::close(fd);  // the listing's own descriptor is gone already
  ::clearenv();
  for (const auto& kv : env) ::putenv(::strdup(kv.c_str()));
}

void open_pipe(int fds[2]) {
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
}

// Signal handlers can only reach the poll loop through this pipe's write end.
int g_wake_fd = -1;
std::atomic<bool> g_running{false};

extern "C" void wake_poll_loop(int sig) {
  int saved = errno;
  unsigned char byte = static_cast<unsigned char>(sig);
  // A full pipe already wakes poll, so a dropped byte loses nothing but a duplicate.
  ssize_t ignored = ::write(g_wake_fd, &byte, 1);
  (void)ignored;
  errno = saved;
}

// Owns SIGINT/SIGTERM/SIGCHLD for the duration of one run() and gives the old handlers back.
class SignalGuard {
 public:
  SignalGuard() {
    if (g_running.exchange(true)) {
      throw std::logic_error(
          "internal error: hp::launch::run() is already running in this "
          "process, please report");
    }
    if (::pipe2(fds_, O_CLOEXEC | O_NONBLOCK) != 0) {
      g_running = false;
      throw std::system_error(errno, std::generic_category(), "pipe");
    }
    g_wake_fd = fds_[1];
    struct sigaction action {};
    action.sa_handler = wake_poll_loop;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    for (size_t i = 0; i < std::size(kHandledSignals); ++i) {
      ::sigaction(kHandledSignals[i], &action, &saved_[i]);
    }
  }
  ~SignalGuard() {
    for (size_t i = 0; i < std::size(kHandledSignals); ++i) {
      ::sigaction(kHandledSignals[i], &saved_[i], nullptr);
    }
    g_wake_fd = -1;
    ::close(fds_[0]);
    ::close(fds_[1]);
    g_running = false;
  }
  SignalGuard(const SignalGuard&) = delete;
  SignalGuard& operator=(const SignalGuard&) = delete;

  int read_fd() const { return fds_[0]; }
  const struct sigaction* saved_actions() const { return saved_; }

 private:
  int fds_[2] = {-1, -1};
  struct sigaction saved_[std::size(kHandledSignals)]{};
};

struct Stream {
  int fd = -1;      // read end of the worker's pipe, -1 once closed
  int out_fd = -1;  // where its lines are relayed
  std::string partial;
};

struct Worker {
  int rank = 0;
  pid_t pid = -1;  // also its process group
  bool started = false;
  bool running = false;
  int status = 0;       // from waitpid; -1 if it was reaped by someone else
  int signal_sent = 0;  // the last signal hp-launch sent it
  std::string exec_error;
  Stream streams[2];
  std::deque<std::string> tail;
};

bool failed(int status) { return status != 0; }

int exit_code_of(int status) {
  if (status >= 0 && WIFEXITED(status)) return WEXITSTATUS(status);
  if (status >= 0 && WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string describe(int status) {
  if (status < 0) return "exit status lost (reaped outside hp-launch)";
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  int sig = WTERMSIG(status);
  return "killed by signal " + std::to_string(sig) + " (" + signal_name(sig) + ")" +
         (WCOREDUMP(status) ? ", core dumped" : "");
}

class Job {
 public:
  Job(const LaunchOptions& options, const std::vector<std::string>& command)
      : options_(options), command_(command) {}

  int run() {
    SignalGuard signals;
    try {
      start_workers(signals);
    } catch (const std::exception& e) {
      // Workers already started must not outlive a launch that could not complete.
      say(std::string("error: ") + e.what() + ", stopping the workers already started");
      launch_failed_ = true;
      begin_stop();
    }
    while (std::any_of(workers_.begin(), workers_.end(), [](auto& w) { return w.running; })) {
      if (stopping_ && killed_ && Clock::now() >= killed_at_ + kKillWait) break;
      poll_once(signals.read_fd(), poll_timeout_ms());
      reap();
      if (stopping_ && !killed_ && Clock::now() >= stop_started_ + kGracePeriod) {
        signal_all(SIGKILL);
      }
    }
    drain();
    return report();
  }

 private:
  void start_workers(const SignalGuard& signals) {
    const int n = options_.nproc_per_node;
    const int world = options_.nnodes * n;
    const int threads = options_.threads_per_worker > 0 ? options_.threads_per_worker
                                                        : std::max(1, usable_cores() / n);
    int port = options_.master_port;
    if (port == 0) port = options_.nnodes == 1 ? pick_free_port() : kMultiNodeDefaultPort;
    const int first = options_.node_rank * n;
    say("starting " + std::to_string(n) + (n == 1 ? " worker (rank " : " workers (ranks ") +
        std::to_string(first) + (n == 1 ? "" : ".." + std::to_string(first + n - 1)) + " of " +
        std::to_string(world) + "), " + std::to_string(threads) + " intra-op thread" +
        (threads == 1 ? "" : "s") + (n == 1 ? ", master " : " each, master ") +
        options_.master_addr + ":" + std::to_string(port));

    workers_.resize(n);
    for (int local = 0; local < n; ++local) workers_[local].rank = first + local;
    // A forked worker starts with copies of this process's stdio buffers.
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
    const std::string t = std::to_string(threads);
    const bool fork_only = fork_workers(options_);
    for (int local = 0; local < n && !stopping_; ++local) {
      std::vector<std::pair<std::string, std::string>> env = {
          {"RANK", std::to_string(first + local)},
          {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", std::to_string(local)},
          {"LOCAL_WORLD_SIZE", std::to_string(n)},
          {"GROUP_RANK", std::to_string(options_.node_rank)},
          {"GROUP_WORLD_SIZE", std::to_string(options_.nnodes)},
          {"MASTER_ADDR", options_.master_addr},
          {"MASTER_PORT", std::to_string(port)},
          {"HP_LAUNCHED", "1"},
          {"OMP_NUM_THREADS", t},
          {"MKL_NUM_THREADS", t},
          {"OPENBLAS_NUM_THREADS", t},
          {"HP_INTRA_OP_THREADS", t}};
      start_worker(workers_[local], worker_environment(env), signals, fork_only);
    }
    // Which pid is which rank: a forked worker's /proc/PID/environ is the
    // launcher's (the kernel shows the environment a process was exec'd with).
    std::string pids;
    for (const auto& w : workers_) {
      if (!w.started) continue;
      pids += (pids.empty() ? "" : ", ") + std::string("rank ") + std::to_string(w.rank) + " pid " +
              std::to_string(w.pid);
    }
    if (!pids.empty()) {
      say(std::string("workers started (") + (fork_only ? "forked from this process" : "exec'd") + "): " + pids);
    }
  }

  void start_worker(Worker& w, std::vector<std::string> env, const SignalGuard& signals, bool fork_only) {
    std::vector<std::string> argv_strings = command_;
    std::vector<char*> argv = c_strings(argv_strings);
    std::vector<char*> envp = c_strings(env);
    std::vector<std::string> candidates = exec_candidates(command_[0]);
    int out[2], err[2], exec_status[2];
    open_pipe(out);
    open_pipe(err);
    open_pipe(exec_status);
    int dev_null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    const pid_t parent = ::getpid();

    // Blocked across fork so that no handler of ours runs in the child before exec and writes
    // into the launcher's wake-up pipe.
    sigset_t block, old_mask;
    sigemptyset(&block);
    for (int sig : kHandledSignals) sigaddset(&block, sig);
    pthread_sigmask(SIG_BLOCK, &block, &old_mask);
    pid_t pid = ::fork();
    if (pid == 0) {
      // Async-signal-safe calls only from here on.
      ::setpgid(0, 0);  // our own group, so that stopping a worker reaches its children too
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // the launcher died before prctl took effect
      if (dev_null >= 0) ::dup2(dev_null, STDIN_FILENO);  // a worker must not stop on tty input
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      for (size_t i = 0; i < std::size(kHandledSignals); ++i) {
        ::sigaction(kHandledSignals[i], &signals.saved_actions()[i], nullptr);
      }
      pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
      if (fork_only) {
        // One thread was forked (fork_workers), so anything may be called.
        // The launcher sees the exec-status pipe close, as after an exec.
        become_worker(env);
        int code = 1;
        try {
          code = options_.in_process();
        } catch (const std::exception& e) {
          std::fprintf(stderr, "rank %d: %s\n", w.rank, e.what());
        } catch (...) {
          std::fprintf(stderr, "rank %d: an unknown exception ended the worker\n", w.rank);
        }
        std::cout.flush();
        std::cerr.flush();
        std::fflush(nullptr);
        ::_exit(code);
      }
      // Same rule as execvp: keep looking past missing files, but report EACCES if seen.
      int error = ENOENT;
      bool denied = false;
      for (const auto& candidate : candidates) {
        ::execve(candidate.c_str(), argv.data(), envp.data());
        error = errno;
        if (error == EACCES) denied = true;
        if (error != ENOENT && error != ENOTDIR && error != EACCES && error != ESTALE) break;
      }
      if (denied && (error == ENOENT || error == ENOTDIR)) error = EACCES;
      ssize_t ignored = ::write(exec_status[1], &error, sizeof(error));
      (void)ignored;
      ::_exit(127);
    }
    int fork_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
    for (int fd : {out[1], err[1], exec_status[1], dev_null}) {
      if (fd >= 0) ::close(fd);
    }
    if (pid < 0) {
      for (int fd : {out[0], err[0], exec_status[0]}) ::close(fd);
      throw std::system_error(fork_errno, std::generic_category(),
                              "starting rank " + std::to_string(w.rank));
    }
    ::setpgid(pid, pid);  // also here, so that no signal can reach the group before it exists
    w.pid = pid;
    w.started = w.running = true;
    w.streams[0] = Stream{out[0], STDOUT_FILENO, {}};
    w.streams[1] = Stream{err[0], STDERR_FILENO, {}};
    for (const auto& s : w.streams) ::fcntl(s.fd, F_SETFL, ::fcntl(s.fd, F_GETFL) | O_NONBLOCK);

    int exec_errno = 0;
    ssize_t n;
    do {
      n = ::read(exec_status[0], &exec_errno, sizeof(exec_errno));
    } while (n < 0 && errno == EINTR);
    ::close(exec_status[0]);
    if (n == sizeof(exec_errno)) {
      w.exec_error = "cannot execute '" + command_[0] + "': " + std::strerror(exec_errno);
      int status = 0;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      finish(w, status);
    }
  }

  int poll_timeout_ms() const {
    // SIGCHLD wakes the loop; the timeout only guards against a host that stole the signal.
    auto timeout = std::chrono::milliseconds(1000);
    if (stopping_) {
      auto deadline = killed_ ? killed_at_ + kKillWait : stop_started_ + kGracePeriod;
      auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      timeout = std::clamp(left, std::chrono::milliseconds(0), timeout);
    }
    return static_cast<int>(timeout.count());
  }

  void poll_once(int wake_fd, int timeout_ms) {
    std::vector<pollfd> fds = {{wake_fd, POLLIN, 0}};
    std::vector<std::pair<Worker*, Stream*>> owners = {{nullptr, nullptr}};
    for (auto& w : workers_) {
      for (auto& s : w.streams) {
        if (s.fd < 0) continue;
        fds.push_back({s.fd, POLLIN, 0});
        owners.emplace_back(&w, &s);
      }
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) return;
    if (fds[0].revents != 0) {
      unsigned char signals[64];
      ssize_t n;
      while ((n = ::read(wake_fd, signals, sizeof(signals))) > 0) {
        for (ssize_t i = 0; i < n; ++i) {
          if (signals[i] == SIGINT || signals[i] == SIGTERM) interrupted(signals[i]);
        }
      }
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) read_stream(*owners[i].first, *owners[i].second);
    }
  }

  void read_stream(Worker& w, Stream& s) {
    char buffer[65536];
    ssize_t n = ::read(s.fd, buffer, sizeof(buffer));
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
      close_stream(w, s);
      return;
    }
    s.partial.append(buffer, static_cast<size_t>(n));
    size_t begin = 0;
    for (size_t nl; (nl = s.partial.find('\n', begin)) != std::string::npos; begin = nl + 1) {
      emit(w, s, s.partial.substr(begin, nl - begin));
    }
    s.partial.erase(0, begin);
    if (s.partial.size() > kMaxLineBytes) {
      emit(w, s, s.partial);
      s.partial.clear();
    }
  }

  void close_stream(Worker& w, Stream& s) {
    if (!s.partial.empty()) emit(w, s, s.partial);  // a last line without its newline
    s.partial.clear();
    ::close(s.fd);
    s.fd = -1;
  }

  void emit(Worker& w, const Stream& s, const std::string& line) {
    write_all(s.out_fd, "[rank " + std::to_string(w.rank) + "] " + line + "\n");
    if (options_.tail_lines <= 0) return;
    w.tail.push_back(line);
    if (w.tail.size() > static_cast<size_t>(options_.tail_lines)) w.tail.pop_front();
  }

  void reap() {
    for (auto& w : workers_) {
      if (!w.running) continue;
      int status = 0;
      pid_t r = ::waitpid(w.pid, &status, WNOHANG);
      if (r == w.pid) finish(w, status);
      if (r < 0 && errno == ECHILD) finish(w, -1);
    }
  }

  void finish(Worker& w, int status) {
    w.running = false;
    w.status = status;
    if (stopping_ || !failed(status)) return;
    cause_ = &w;
    if (std::any_of(workers_.begin(), workers_.end(), [](auto& o) { return o.running; })) {
      say("rank " + std::to_string(w.rank) + " failed: " + describe(status) +
          "; stopping the other workers");
    }
    begin_stop();
  }

  void interrupted(int sig) {
    if (stopping_) {
      // A second interrupt means the user will not wait for the grace period.
      if (!killed_) signal_all(SIGKILL);
      return;
    }
    interrupt_signal_ = sig;
    say("interrupted by " + signal_name(sig) + ", stopping the workers (SIGKILL in " +
        std::to_string(kGracePeriod.count()) + " s if still running)");
    begin_stop();
  }

  void begin_stop() {
    stopping_ = true;
    stop_started_ = Clock::now();
    signal_all(SIGTERM);
  }

  void signal_all(int sig) {
    if (sig == SIGKILL) {
      killed_ = true;
      killed_at_ = Clock::now();
    }
    for (auto& w : workers_) {
      if (!w.started) continue;
      // Ended workers too: children they left behind in their group still hold resources.
      ::kill(-w.pid, sig);
      if (w.running) w.signal_sent = sig;
    }
  }

  void drain() {
    auto deadline = Clock::now() + kDrainWait;
    auto open = [&] {
      return std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) {
        return w.streams[0].fd >= 0 || w.streams[1].fd >= 0;
      });
    };
    while (open() && Clock::now() < deadline) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      poll_once(-1, static_cast<int>(left.count()));
    }
    for (auto& w : workers_) {
      for (auto& s : w.streams) {
        if (s.fd >= 0) close_stream(w, s);
      }
    }
  }

  std::string fate(const Worker& w) const {
    std::string who = "rank " + std::to_string(w.rank) + " ";
    if (!w.started) return who + "not started";
    if (w.running) return who + "still running after SIGKILL (pid " + std::to_string(w.pid) + ")";
    if (w.signal_sent == 0) {
      return who + (failed(w.status) ? "also failed (" : "finished (") + describe(w.status) + ")";
    }
    std::string how = signal_name(w.signal_sent);
    bool by_that_signal =
        w.status >= 0 && WIFSIGNALED(w.status) && WTERMSIG(w.status) == w.signal_sent;
    if (!by_that_signal) how += ", then " + describe(w.status);
    return who + "terminated by hp-launch (" + how + ")";
  }

  std::string fates(const Worker* except) const {
    std::string out;
    for (const auto& w : workers_) {
      if (&w == except) continue;
      out += (out.empty() ? "" : ", ") + fate(w);
    }
    return out;
  }

  int report() const {
    if (cause_ != nullptr) {
      const Worker& w = *cause_;
      std::string what = describe(w.status);
      if (!w.exec_error.empty()) what += ": " + w.exec_error;
      say("rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.pid) +
          ") failed: " + what);
      if (options_.tail_lines > 0) {
        if (w.tail.empty() && w.exec_error.empty()) {
          say("rank " + std::to_string(w.rank) + " printed nothing");
        } else if (!w.tail.empty()) {
          say("last " + std::to_string(w.tail.size()) + (w.tail.size() == 1 ? " line" : " lines") +
              " of rank " + std::to_string(w.rank) + ":");
          std::string text;
          for (const auto& line : w.tail)
            text += "[rank " + std::to_string(w.rank) + "] " + line + "\n";
          write_all(STDERR_FILENO, text);
        }
      }
      if (workers_.size() > 1) say("other ranks: " + fates(&w));
      say_flight_records();
      return exit_code_of(w.status);
    }
    if (launch_failed_) return 1;
    if (interrupt_signal_ != 0) {
      say("interrupted by " + signal_name(interrupt_signal_) + "; " + fates(nullptr));
      return 128 + interrupt_signal_;
    }
    return 0;
  }

  /// Names the flight records the workers wrote, and the command that
  /// compares them.
  void say_flight_records() const {
    std::string dir = options_.flight_dir;
    if (dir.empty()) {
      if (const char* env = std::getenv("HP_FLIGHT_DIR")) dir = env;
    }
    if (dir.empty()) return;
    std::vector<std::string> files;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      const std::string f = e.path().filename().string();
      if (f.rfind("rank", 0) == 0 && e.path().extension() == ".json") files.push_back(f);
    }
    if (files.empty()) {
      say("no flight records in " + dir);
      return;
    }
    std::sort(files.begin(), files.end());
    std::string list;
    for (const auto& f : files) list += (list.empty() ? "" : ", ") + f;
    say("flight records in " + dir + ": " + list + "; compare them with: hp-flight " + dir);
  }

  const LaunchOptions& options_;
  const std::vector<std::string>& command_;
  std::vector<Worker> workers_;
  const Worker* cause_ = nullptr;
  int interrupt_signal_ = 0;
  bool launch_failed_ = false;
  bool stopping_ = false;
  bool killed_ = false;
  Clock::time_point stop_started_;
  Clock::time_point killed_at_;
};

void add_flags(CLI::App& app, LaunchOptions& o) {
  app.add_option("--nproc-per-node,--nproc_per_node", o.nproc_per_node,
                 "workers to start on this node")
      ->type_name("N");
  app.add_option("--nnodes", o.nnodes, "nodes in the job, each running its own hp-launch")
      ->type_name("M");
  app.add_option("--node-rank,--node_rank", o.node_rank, "this node's index, 0 to M-1")
      ->type_name("K");
  app.add_option("--master-addr,--master_addr", o.master_addr,
                 "address of rank 0's node (default 127.0.0.1)")
      ->type_name("ADDR");
  app.add_option("--master-port,--master_port", o.master_port,
                 "rank 0's port (default: a free one below the kernel's ephemeral range for a single node, "
                 "29500 otherwise)")
      ->type_name("PORT");
  app.add_option("--threads-per-worker", o.threads_per_worker,
                 "intra-op threads per worker (default: usable cores / N, at least 1)")
      ->type_name("T");
  app.add_option("--tail-lines", o.tail_lines,
                 "output lines of a failed rank to repeat in the summary (default 20)")
      ->type_name("L");
  app.add_option("--flight-dir", o.flight_dir,
                 "where the workers write flight records on a failure; the summary lists them "
                 "(default: $HP_FLIGHT_DIR)")
      ->type_name("DIR");
}

constexpr const char* kDescription =
    "Starts N workers of a distributed job on this node with torchrun's environment (RANK, "
    "WORLD_SIZE, LOCAL_RANK, ...), prefixes their output with [rank R], and stops them all "
    "when one fails.";

constexpr const char* kFooter =
    "The worker command goes after '--': hp-launch --nproc-per-node N [flags] -- CMD ARGS...";

constexpr const char* kExample = "e.g. hp-launch --nproc-per-node 2 -- ./bin/hp-train config.yaml";

}  // namespace

std::string usage() {
  CLI::App app{kDescription, "hp-launch"};
  app.footer(kFooter);
  LaunchOptions ignored;
  add_flags(app, ignored);
  return app.help();
}

void validate(const LaunchOptions& o) {
  auto require = [](bool ok, const std::string& message) {
    if (!ok) throw UsageError(message);
  };
  require(o.nproc_per_node >= 1, "--nproc-per-node is " + std::to_string(o.nproc_per_node) +
                                     ", but it must be at least 1: it is the number of workers "
                                     "to start on this node");
  require(o.nnodes >= 1, "--nnodes is " + std::to_string(o.nnodes) + ", but it must be at least 1");
  require(o.node_rank >= 0 && o.node_rank < o.nnodes,
          "--node-rank is " + std::to_string(o.node_rank) + ", but it must be between 0 and " +
              "--nnodes - 1 = " + std::to_string(o.nnodes - 1) + " (node ranks count from 0)");
  require(static_cast<long long>(o.nnodes) * o.nproc_per_node <= 1 << 30,
          "--nnodes " + std::to_string(o.nnodes) + " times --nproc-per-node " +
              std::to_string(o.nproc_per_node) + " is more than 2^30 ranks");
  require(!o.master_addr.empty(), "--master-addr is empty; give rank 0's host name or address");
  require(
      o.master_port >= 0 && o.master_port <= 65535,
      "--master-port is " + std::to_string(o.master_port) + ", but it must be between 1 and 65535");
  require(o.threads_per_worker >= 0,
          "--threads-per-worker is " + std::to_string(o.threads_per_worker) +
              ", but it must be at least 1 (leave it out to divide the cores among the workers)");
  require(o.tail_lines >= 0,
          "--tail-lines is " + std::to_string(o.tail_lines) + ", but it must be 0 or more");
}

ParsedArgs parse_args(int argc, const char* const* argv) {
  ParsedArgs parsed;
  int split = 1;
  while (split < argc && std::strcmp(argv[split], "--") != 0) ++split;
  std::vector<std::string> flags(argv + std::min(1, argc), argv + split);
  if (split < argc) parsed.command.assign(argv + split + 1, argv + argc);

  CLI::App app{kDescription, "hp-launch"};
  app.footer(kFooter);
  add_flags(app, parsed.options);
  app.allow_extras();                        // so that a forgotten "--" gets a message that says so
  std::reverse(flags.begin(), flags.end());  // CLI11 consumes the vector from its back
  try {
    app.parse(flags);
  } catch (const CLI::CallForHelp&) {
    parsed.help = true;
    return parsed;
  } catch (const CLI::ConversionError& e) {
    throw UsageError(std::string(e.what()) + ": it must be a whole number");
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
  if (!app.remaining().empty()) {
    const std::string extra = app.remaining().front();
    if (extra.rfind("-", 0) == 0) throw UsageError("unknown flag '" + extra + "'");
    throw UsageError("unexpected argument '" + extra +
                     "': flags go before '--' and the worker command after it, " + kExample);
  }
  if (app.count("--master-port") > 0 && parsed.options.master_port == 0) {
    throw UsageError(
        "--master-port is 0, but it must be between 1 and 65535 (leave it out to "
        "let hp-launch choose)");
  }
  if (app.count("--threads-per-worker") > 0 && parsed.options.threads_per_worker == 0) {
    throw UsageError(
        "--threads-per-worker is 0, but it must be at least 1 (leave it out to "
        "divide the cores among the workers)");
  }
  validate(parsed.options);
  if (parsed.command.empty()) {
    throw UsageError("no worker command: put it after '--', " + std::string(kExample));
  }
  if (parsed.command.front().empty()) {
    throw UsageError("the worker command is empty: put the program to run after '--', " +
                     std::string(kExample));
  }
  return parsed;
}

int run(const LaunchOptions& options, const std::vector<std::string>& command) {
  validate(options);
  if (command.empty() || command.front().empty()) {
    throw UsageError("the worker command is empty: put the program to run after '--', " +
                     std::string(kExample));
  }
  return Job(options, command).run();
}

int run_cli(int argc, const char* const* argv) {
  try {
    ParsedArgs parsed = parse_args(argc, argv);
    if (parsed.help) {
      write_all(STDOUT_FILENO, usage());
      return 0;
    }
    return run(parsed.options, parsed.command);
  } catch (const UsageError& e) {
    say(std::string("error: ") + e.what() + "\nRun 'hp-launch --help' for all flags.");
    return kUsageExitCode;
  } catch (const std::exception& e) {
    say(std::string("error: ") + e.what());
    return 1;
  }
}

}  // namespace hp::launch
