#pragma once
// The run profiler's recorder: timed spans (forward, backward, stage-message
// waits, collectives, optimizer step, checkpoint saves, evaluation) kept in
// memory while recording is on, written as Chrome trace-event JSON ("X"
// complete events, ts and dur in microseconds) that Perfetto and
// chrome://tracing open.
//
// Recording is process-wide and off by default. A Span constructed while
// it is off costs one relaxed atomic load and keeps nothing, so the spans
// stay in the code paths for good. Anything may record (the trainer, step
// executors in plugins, the communication groups); the trainer switches
// recording on for the steps `run.profile.steps` names. Free of LibTorch.
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace hp::profile {

namespace detail {
extern std::atomic<bool> g_recording;
}

/// True while spans are being recorded (cheap: one relaxed load).
inline bool recording() noexcept { return detail::g_recording.load(std::memory_order_relaxed); }

/// One argument of a span: a number or a string.
struct Arg {
  std::string key;
  std::string text;
  double number = 0;
  bool is_number = true;
};

/// One finished span. Times are wall-clock nanoseconds since the Unix epoch
/// (a steady clock offset once by the wall clock, so a span never runs
/// backwards and ranks on one machine line up).
struct Event {
  std::string name;
  std::string
      category;  ///< "compute", "comm", "pipeline", "optimizer", "checkpoint", "eval", "step"
  std::int64_t begin_ns = 0;
  std::int64_t end_ns = 0;
  int thread = 0;  ///< 0 for the first thread that recorded, then 1, 2, ...
  std::vector<Arg> args;
};

/// Switches recording on or off for the whole process.
void set_recording(bool on) noexcept;
/// Takes every event recorded so far (in the order they ended) and clears them.
std::vector<Event> take_events();
/// Events recorded and not yet taken.
std::size_t pending_events();
/// Now, on the recorder's clock (wall-clock nanoseconds, monotonic).
std::int64_t now_ns() noexcept;

/// The track (a thread row of the trace) named `label`, created on first
/// use: for work that runs off the recording threads' stacks, as
/// communication in flight on a group. Same label, same track.
int track(const std::string& label);
/// The track this thread's Spans go to.
int this_thread_track() noexcept;
/// Keeps an event timed elsewhere (begin/end/thread set by the caller; the
/// caller checked recording() when the work began).
void record(Event e);

/// Times the enclosing scope: `profile::Span s("comm", "all_reduce");
/// s.arg("bytes", n);`. Spans of one thread nest (a scope inside another ends
/// first). When recording is off nothing is kept and arg() does nothing.
class Span {
 public:
  Span(const char* category, const char* name) noexcept {
    if (recording()) open(category, name);
  }
  Span(const char* category, const std::string& name) noexcept {
    if (recording()) open(category, name.c_str());
  }
  ~Span() {
    if (event_) close();
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

  bool active() const noexcept { return event_.has_value(); }
  template <typename Number, typename = std::enable_if_t<std::is_arithmetic_v<Number>>>
  Span& arg(const char* key, Number value) {
    if (event_) event_->args.push_back({key, {}, static_cast<double>(value), true});
    return *this;
  }
  Span& arg(const char* key, const std::string& value) {
    if (event_) event_->args.push_back({key, value, 0, false});
    return *this;
  }
  Span& arg(const char* key, const char* value) {
    if (event_) event_->args.push_back({key, value, 0, false});
    return *this;
  }
  /// Ends the span now instead of at the end of the scope.
  void end() {
    if (event_) close();
  }

 private:
  void open(const char* category, const char* name) noexcept;
  void close() noexcept;
  std::optional<Event> event_;
};

/// Writes one rank's events as a Chrome trace (JSON object format): process
/// id = `rank`, named `process_label`; one thread track per recording
/// thread; "X" events with ts relative to the earliest event, in µs with
/// nanosecond digits; that origin as otherData.origin_unix_ns so
/// merge_traces can line ranks up. Throws std::runtime_error naming the
/// file when it cannot be written.
void write_rank_trace(const std::string& path, int rank, const std::string& process_label,
                      const std::vector<Event>& events);

/// Merges rank traces written by write_rank_trace into one trace at
/// `output` (one process track per rank, all on the earliest rank's time
/// origin). Missing inputs are skipped and returned; a file that is not a
/// rank trace throws std::runtime_error naming it.
std::vector<std::string> merge_traces(const std::vector<std::string>& inputs,
                                      const std::string& output);

}  // namespace hp::profile
