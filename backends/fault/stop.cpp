#include "hp/fault/stop.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <errno.h>

#include <cerrno>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

namespace hp::stop {
namespace {

std::atomic<int> g_requested{0};
std::atomic<int> g_sender_pid{0};
std::atomic<int> g_rank{-1};
int g_wake[2] = {-1, -1};
/// stderr, duplicated at install: exit() closes fd 2 with the stdio
/// streams, and a SIGTERM may arrive while the process is exiting anyway.
int g_err = STDERR_FILENO;

// Never destroyed: the stop thread may use them while exit() runs the
// static destructors.
std::mutex& notes_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::map<int, std::function<std::string()>>& notes() {
  static auto* n = new std::map<int, std::function<std::string()>>;
  return *n;
}
int g_next_id = 1;  // under notes_mutex()

extern "C" void on_sigterm(int, siginfo_t* info, void*) {
  // A second SIGTERM: the first one's notes are taking too long, leave now.
  if (g_requested.exchange(1) != 0) ::_exit(kExitCode);
  g_sender_pid.store(info != nullptr ? static_cast<int>(info->si_pid) : 0);
  const char byte = 1;
  const ssize_t n = ::write(g_wake[1], &byte, 1);
  (void)n;
}

/// The command name of `pid` ("hp-launch"), "" when it cannot be read.
std::string process_name(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

std::string head() {
  return std::string(program_invocation_short_name) + ": rank " + std::to_string(g_rank.load()) +
         " stopped by SIGTERM from " + sender();
}

[[noreturn]] void leave(const std::string& line) {
  std::size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(g_err, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  ::_exit(kExitCode);
}

void stop_thread() {
  char byte = 0;
  while (::read(g_wake[0], &byte, 1) < 0 && errno == EINTR) {
  }
  std::thread([] {
    std::this_thread::sleep_for(kNoteBudget);
    leave(head() + "; what it was doing could not be collected within " +
          std::to_string(kNoteBudget.count()) + " ms; exit code " + std::to_string(kExitCode) +
          "\n");
  }).detach();
  std::string line = head();
  {
    // Held while the notes run, so remove_note waits and what they read stays alive.
    std::lock_guard<std::mutex> lock(notes_mutex());
    for (const auto& [id, note] : notes()) {
      try {
        const std::string clause = note();
        if (!clause.empty()) line += "; " + clause;
      } catch (const std::exception& e) {
        line += std::string("; (a note failed: ") + e.what() + ")";
      } catch (...) {
      }
    }
  }
  for (auto& c : line) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  leave(line + "; exit code " + std::to_string(kExitCode) + "\n");
}

}  // namespace

void install(int rank) {
  g_rank.store(rank);
  static std::once_flag once;
  std::call_once(once, [] {
    if (::pipe2(g_wake, O_CLOEXEC) != 0) return;  // SIGTERM keeps its default action
    const int err = ::fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
    if (err >= 0) g_err = err;
    notes_mutex();  // created before any thread can need them
    notes();
    std::thread(stop_thread).detach();
    struct sigaction action {};
    action.sa_sigaction = on_sigterm;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGTERM, &action, nullptr);
  });
}

bool requested() { return g_requested.load() != 0; }

std::string sender() {
  const int pid = g_sender_pid.load();
  if (pid <= 0) return "the kernel or an unknown process";
  const std::string name = process_name(pid);
  return (name.empty() ? "" : name + " ") + "(pid " + std::to_string(pid) + ")";
}

int add_note(std::function<std::string()> note) {
  std::lock_guard<std::mutex> lock(notes_mutex());
  const int id = g_next_id++;
  notes().emplace(id, std::move(note));
  return id;
}

void remove_note(int id) {
  std::lock_guard<std::mutex> lock(notes_mutex());
  notes().erase(id);
}

}  // namespace hp::stop
