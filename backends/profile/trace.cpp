#include "hp/profile/trace.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace hp::profile {

namespace detail {
std::atomic<bool> g_recording{false};
}

namespace {

std::mutex g_mutex;
std::vector<Event> g_events;
std::atomic<int> g_next_thread{0};
thread_local int t_thread = -1;

// The steady clock, shifted once onto the wall clock: monotonic within a
// process, comparable between processes (to the wall clocks' agreement).
std::int64_t wall_offset_ns() {
  static const std::int64_t offset = [] {
    const auto wall = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
    const auto steady = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
    return static_cast<std::int64_t>(wall - steady);
  }();
  return offset;
}

// Microseconds with nanosecond digits, exactly ("12.345"), for ns >= 0.
std::string micros(std::int64_t ns) {
  std::string frac = std::to_string(ns % 1000);
  return std::to_string(ns / 1000) + "." + std::string(3 - frac.size(), '0') + frac;
}

nlohmann::json args_json(const std::vector<Arg>& args) {
  nlohmann::json j = nlohmann::json::object();
  for (const Arg& a : args) {
    if (a.is_number && std::floor(a.number) == a.number && std::fabs(a.number) < 9e15) {
      j[a.key] = static_cast<std::int64_t>(a.number);  // counts and indices read as integers
    } else if (a.is_number) {
      j[a.key] = a.number;
    } else {
      j[a.key] = a.text;
    }
  }
  return j;
}

void emit_complete(std::ostream& out, const std::string& name, const std::string& category, int pid,
                   int tid, std::int64_t ts_ns, std::int64_t dur_ns, const nlohmann::json& args) {
  out << "{\"name\":" << nlohmann::json(name).dump()
      << ",\"cat\":" << nlohmann::json(category).dump() << ",\"ph\":\"X\",\"pid\":" << pid
      << ",\"tid\":" << tid << ",\"ts\":" << micros(ts_ns) << ",\"dur\":" << micros(dur_ns)
      << ",\"args\":" << args.dump() << "}";
}

nlohmann::json metadata(const char* what, int pid, int tid, const nlohmann::json& args) {
  return {{"name", what}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", args}};
}

void open_for_writing(std::ofstream& out, const std::string& path) {
  const auto parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  out.open(path, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error("profile: cannot write the trace file " + path);
}

}  // namespace

void set_recording(bool on) noexcept { detail::g_recording.store(on, std::memory_order_relaxed); }

std::int64_t now_ns() noexcept {
  return static_cast<std::int64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                       std::chrono::steady_clock::now().time_since_epoch())
                                       .count()) +
         wall_offset_ns();
}

std::vector<Event> take_events() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<Event> out;
  out.swap(g_events);
  return out;
}

std::size_t pending_events() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_events.size();
}

namespace {
std::map<int, std::string> g_track_names;  // guarded by g_mutex
constexpr int kFirstNamedTrack = 1000;
}  // namespace

int track(const std::string& label) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (const auto& [id, name] : g_track_names) {
    if (name == label) return id;
  }
  const int id = kFirstNamedTrack + static_cast<int>(g_track_names.size());
  g_track_names[id] = label;
  return id;
}

int this_thread_track() noexcept {
  if (t_thread < 0) t_thread = g_next_thread.fetch_add(1);
  return t_thread;
}

void record(Event e) {
  try {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_events.push_back(std::move(e));
  } catch (...) {
    // Out of memory: drop the event rather than fail the step.
  }
}

void Span::open(const char* category, const char* name) noexcept {
  try {
    this_thread_track();
    event_.emplace();
    event_->name = name;
    event_->category = category;
    event_->thread = t_thread;
    event_->begin_ns = now_ns();
  } catch (...) {
    event_.reset();  // out of memory: this span is simply not recorded
  }
}

void Span::close() noexcept {
  event_->end_ns = now_ns();
  try {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_events.push_back(std::move(*event_));
  } catch (...) {
    // Out of memory: drop the span rather than fail the step.
  }
  event_.reset();
}

void write_rank_trace(const std::string& path, int rank, const std::string& process_label,
                      const std::vector<Event>& events) {
  std::vector<const Event*> sorted;
  sorted.reserve(events.size());
  for (const Event& e : events) sorted.push_back(&e);
  // Parents before their children: by begin, then the longer first.
  std::stable_sort(sorted.begin(), sorted.end(), [](const Event* a, const Event* b) {
    if (a->begin_ns != b->begin_ns) return a->begin_ns < b->begin_ns;
    return a->end_ns > b->end_ns;
  });
  const std::int64_t origin = sorted.empty() ? now_ns() : sorted.front()->begin_ns;
  std::map<int, bool> threads;
  for (const Event* e : sorted) threads[e->thread] = true;

  std::ofstream out;
  open_for_writing(out, path);
  out << "{\"traceEvents\":[\n";
  out << metadata("process_name", rank, 0, {{"name", process_label}}).dump();
  out << ",\n" << metadata("process_sort_index", rank, 0, {{"sort_index", rank}}).dump();
  std::map<int, std::string> named;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    named = g_track_names;
  }
  for (const auto& kv : threads) {
    const std::string name = named.count(kv.first) ? named[kv.first]
                             : kv.first == 0       ? "main"
                                                   : "thread " + std::to_string(kv.first);
    out << ",\n" << metadata("thread_name", rank, kv.first, {{"name", name}}).dump();
  }
  for (const Event* e : sorted) {
    out << ",\n";
    emit_complete(out, e->name, e->category, rank, e->thread, e->begin_ns - origin,
                  std::max<std::int64_t>(0, e->end_ns - e->begin_ns), args_json(e->args));
  }
  out << "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"origin_unix_ns\":" << origin
      << ",\"rank\":" << rank << "}}\n";
  out.close();
  if (!out) throw std::runtime_error("profile: cannot write the trace file " + path);
}

std::vector<std::string> merge_traces(const std::vector<std::string>& inputs,
                                      const std::string& output) {
  struct Part {
    nlohmann::json trace;
    std::int64_t origin;
  };
  std::vector<Part> parts;
  std::vector<std::string> missing;
  std::int64_t earliest = std::numeric_limits<std::int64_t>::max();
  for (const std::string& path : inputs) {
    std::ifstream in(path);
    if (!in) {
      missing.push_back(path);
      continue;
    }
    Part p;
    try {
      in >> p.trace;
      p.origin = p.trace.at("otherData").at("origin_unix_ns").get<std::int64_t>();
      if (!p.trace.at("traceEvents").is_array())
        throw std::runtime_error("traceEvents is not an array");
    } catch (const std::exception& e) {
      throw std::runtime_error("profile: " + path +
                               " is not a rank trace written by the trainer (" +
                               std::string(e.what()).substr(0, 120) + ")");
    }
    earliest = std::min(earliest, p.origin);
    parts.push_back(std::move(p));
  }
  std::ofstream out;
  open_for_writing(out, output);
  out << "{\"traceEvents\":[";
  bool first = true;
  for (const Part& p : parts) {
    const std::int64_t shift = p.origin - earliest;
    for (const auto& e : p.trace["traceEvents"]) {
      out << (first ? "\n" : ",\n");
      first = false;
      if (e.value("ph", "") != "X") {
        out << e.dump();
        continue;
      }
      // ts and dur were written with exact nanosecond digits: read them back
      // as integers so the merged spans still nest exactly.
      const auto ns = [](double us) {
        return static_cast<std::int64_t>(us * 1000.0 + (us >= 0 ? 0.5 : -0.5));
      };
      emit_complete(out, e.at("name").get<std::string>(), e.value("cat", ""),
                    e.at("pid").get<int>(), e.at("tid").get<int>(),
                    ns(e.at("ts").get<double>()) + shift, ns(e.at("dur").get<double>()),
                    e.value("args", nlohmann::json::object()));
    }
  }
  out << "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"origin_unix_ns\":"
      << (parts.empty() ? 0 : earliest) << ",\"ranks\":" << parts.size() << "}}\n";
  out.close();
  if (!out) throw std::runtime_error("profile: cannot write the trace file " + output);
  return missing;
}

}  // namespace hp::profile
