#pragma once
// The flight recorder: every rank keeps, in a fixed-size ring, its
// collective calls and stage messages (group, operation, per-group sequence
// number, bytes, start and end, state) with the action it was in (step,
// phase, micro-batch, chunk). A heartbeat thread publishes, about once a
// second, each group's progress and the current action to a file every
// rank can read; a watchdog compares them when this rank has waited in one
// operation longer than the stall threshold and names the rank that is
// behind, where it is and for how long. On a failure the ring is written
// to <dir>/rank<RRRRR>.json for `hp-flight` to compare. Free of LibTorch.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace hp::dist::flight {

/// What a rank is doing, as the trainer and the step executor know it.
enum class Phase { kIdle, kForward, kBackward, kGradSync, kOptimizer, kCheckpoint, kEval, kSetup };
const char* to_string(Phase p);
Phase phase_from_string(const std::string& s);

struct Action {
  std::int64_t step = -1;
  Phase phase = Phase::kSetup;
  int micro_batch = -1;
  int chunk = -1;
  std::string where;  ///< set by a step executor, e.g. "pipeline stage 1"
};
/// "step 29, backward of micro-batch 1", "step 3, forward of micro-batch 2,
/// chunk 1 (pipeline stage 1)", "step 3, gradient sync".
std::string describe(const Action& a);

/// Sets this process's current action (any thread; the last one wins).
void set_action(const Action& a);
/// Changes only the phase (and micro-batch/chunk) within the current step.
void set_phase(Phase p, int micro_batch = -1, int chunk = -1);
void set_step(std::int64_t step);
/// Where in a schedule this rank runs ("pipeline stage 1"), kept until changed.
void set_where(const std::string& where);
Action current_action();

enum class State { kIssued, kDone, kFailed };
const char* to_string(State s);

/// Collective (every member calls it in the same order: `seq` is the
/// per-group count) or point to point (`seq` counts messages to / from
/// `peer`, a member index).
enum class Kind { kCollective, kSend, kRecv };

struct Entry {
  std::uint64_t id = 0;
  std::string group;
  std::string op;  ///< all_reduce, broadcast, all_gather, all_to_all, reduce_scatter, barrier, send, recv
  Kind kind = Kind::kCollective;
  std::uint64_t seq = 0;
  int peer = -1;   ///< member index, point to point only
  std::uint64_t bytes = 0;
  double start = 0, end = 0;  ///< seconds since the epoch (wall clock); end 0 while issued
  State state = State::kIssued;
  Action action;
};

/// One group's progress as the heartbeat publishes it.
struct GroupProgress {
  std::vector<int> members;      ///< global ranks, in group order
  std::uint64_t issued = 0;      ///< collectives entered
  std::uint64_t done = 0;        ///< collectives completed
  std::map<int, std::uint64_t> sent, received;  ///< messages issued to / completed from each member index
  /// Receives posted from each member index (several may be posted ahead;
  /// not published: `seq` of a receive is its place in this count).
  std::map<int, std::uint64_t> posted;
  bool pending = false;          ///< an operation in flight
  Entry current;                 ///< that operation (when pending)
};

/// What one rank publishes.
struct Heartbeat {
  int rank = -1;
  double time = 0;  ///< wall clock of the beat
  Action action;
  std::map<std::string, GroupProgress> groups;
};

class Recorder {
 public:
  Recorder(int rank, std::size_t capacity);

  int rank() const { return rank_; }
  /// Declares a group this rank belongs to (members in group order).
  void add_group(const std::string& name, const std::vector<int>& members);
  /// Records an operation entering; returns its id for finish().
  std::uint64_t issue(const std::string& group, const std::string& op, Kind kind, int peer, std::uint64_t bytes);
  void finish(std::uint64_t id, bool ok);
  /// The rank now blocks on operation `id`: a send being waited for becomes
  /// its group's pending operation (a send only posted is not, so a receive
  /// or collective issued after it is what a stall report names).
  void waiting(std::uint64_t id);

  /// The ring's entries, oldest first (at most capacity).
  std::vector<Entry> entries() const;
  std::size_t capacity() const { return ring_.size(); }
  std::uint64_t total_recorded() const;
  Heartbeat heartbeat() const;

 private:
  int rank_;
  mutable std::mutex mu_;
  std::vector<Entry> ring_;
  std::uint64_t next_id_ = 1;
  std::map<std::string, GroupProgress> groups_;
  std::map<std::uint64_t, std::size_t> live_;  ///< id -> ring slot of operations in flight
  std::set<std::uint64_t> waited_sends_;       ///< sends this rank blocks on (in flight)
};

/// JSON text of a heartbeat / a whole record (heartbeat + entries), and back.
std::string to_json(const Heartbeat& h);
Heartbeat heartbeat_from_json(const std::string& text);
/// One entry of a record's "entries" list, as JSON text.
Entry entry_from_json(const std::string& text);
/// `heartbeat_seconds` is stored so a reader judges staleness by the run's own beat.
std::string record_json(const Recorder& r, const std::string& reason, double heartbeat_seconds);

/// Seconds since the epoch, wall clock (comparable across processes).
double now_seconds();

struct WatchOptions {
  std::string dir;                ///< heartbeats and records: <run.output_dir>/flight
  double heartbeat_seconds = 1.0;
  double stall_seconds = 30.0;
  bool abort_on_stall = false;
};

/// The heartbeat and watchdog thread of one rank. Starts on construction,
/// stops on destruction. `report` receives each stall line once (the
/// default logs it to stderr); with abort_on_stall the process writes its
/// record and ends (exit code 3) after reporting.
class Watchdog {
 public:
  Watchdog(std::shared_ptr<Recorder> recorder, WatchOptions options,
           std::function<void(const std::string&)> report = nullptr);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  /// Writes <dir>/rank<RRRRR>.json with `reason`; returns its path ("" on failure).
  std::string dump(const std::string& reason) const;
  /// One pass of the stall check (the thread calls it; tests may too).
  std::vector<std::string> check() const;

 private:
  void loop();
  void beat() const;
  std::shared_ptr<Recorder> rec_;
  WatchOptions o_;
  std::function<void(const std::string&)> report_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  mutable std::map<std::string, std::uint64_t> reported_;  // group -> entry id already reported
  std::thread thread_;
};

}  // namespace hp::dist::flight
