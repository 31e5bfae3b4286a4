#include "hp/comm/flight_recorder.h"

#include <unistd.h>

#include <atomic>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "backends/comm/flight_analysis.h"
#include "backends/comm/rank_files.h"

namespace hp::dist::flight {

namespace {

std::mutex g_action_mu;
Action g_action;

const char* kPhases[] = {"idle", "forward", "backward", "gradient sync", "optimizer", "checkpoint", "eval", "setup"};

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kCollective: return "collective";
    case Kind::kSend: return "send";
    case Kind::kRecv: return "recv";
  }
  return "?";
}

Kind kind_from(const std::string& s) { return s == "send" ? Kind::kSend : s == "recv" ? Kind::kRecv : Kind::kCollective; }

nlohmann::json action_json(const Action& a) {
  return {{"step", a.step}, {"phase", to_string(a.phase)}, {"micro_batch", a.micro_batch}, {"chunk", a.chunk},
          {"where", a.where}};
}

Action action_from(const nlohmann::json& j) {
  Action a;
  a.step = j.value("step", std::int64_t{-1});
  a.phase = phase_from_string(j.value("phase", std::string("setup")));
  a.micro_batch = j.value("micro_batch", -1);
  a.chunk = j.value("chunk", -1);
  a.where = j.value("where", std::string());
  return a;
}

nlohmann::json entry_json(const Entry& e) {
  return {{"id", e.id},       {"group", e.group}, {"op", e.op},       {"kind", kind_name(e.kind)},
          {"seq", e.seq},     {"peer", e.peer},   {"bytes", e.bytes}, {"start", e.start},
          {"end", e.end},     {"state", to_string(e.state)},          {"action", action_json(e.action)}};
}

Entry entry_from(const nlohmann::json& j) {
  Entry e;
  e.id = j.value("id", std::uint64_t{0});
  e.group = j.value("group", std::string());
  e.op = j.value("op", std::string());
  e.kind = kind_from(j.value("kind", std::string("collective")));
  e.seq = j.value("seq", std::uint64_t{0});
  e.peer = j.value("peer", -1);
  e.bytes = j.value("bytes", std::uint64_t{0});
  e.start = j.value("start", 0.0);
  e.end = j.value("end", 0.0);
  const std::string st = j.value("state", std::string("issued"));
  e.state = st == "done" ? State::kDone : st == "failed" ? State::kFailed : State::kIssued;
  if (j.contains("action")) e.action = action_from(j.at("action"));
  return e;
}

nlohmann::json heartbeat_json(const Heartbeat& h) {
  nlohmann::json groups = nlohmann::json::object();
  for (const auto& [name, g] : h.groups) {
    nlohmann::json sent = nlohmann::json::object(), recv = nlohmann::json::object();
    for (const auto& [m, n] : g.sent) sent[std::to_string(m)] = n;
    for (const auto& [m, n] : g.received) recv[std::to_string(m)] = n;
    nlohmann::json gj = {{"members", g.members}, {"issued", g.issued}, {"done", g.done}, {"sent", sent},
                         {"received", recv}};
    if (g.pending) gj["pending"] = entry_json(g.current);
    groups[name] = gj;
  }
  return {{"rank", h.rank}, {"time", h.time}, {"action", action_json(h.action)}, {"groups", groups}};
}

Heartbeat heartbeat_from(const nlohmann::json& j) {
  Heartbeat h;
  h.rank = j.value("rank", -1);
  h.time = j.value("time", 0.0);
  if (j.contains("action")) h.action = action_from(j.at("action"));
  if (j.contains("groups")) {
    for (const auto& [name, gj] : j.at("groups").items()) {
      GroupProgress g;
      g.members = gj.value("members", std::vector<int>{});
      g.issued = gj.value("issued", std::uint64_t{0});
      g.done = gj.value("done", std::uint64_t{0});
      if (gj.contains("sent")) for (const auto& [m, n] : gj.at("sent").items()) g.sent[std::stoi(m)] = n.get<std::uint64_t>();
      if (gj.contains("received")) {
        for (const auto& [m, n] : gj.at("received").items()) g.received[std::stoi(m)] = n.get<std::uint64_t>();
      }
      if (gj.contains("pending")) {
        g.pending = true;
        g.current = entry_from(gj.at("pending"));
      }
      h.groups[name] = g;
    }
  }
  return h;
}

void write_atomically(const std::string& path, const std::string& text) {
  // One temporary file per write: the watchdog thread (a stall), the stop
  // thread (SIGTERM) and a failing main thread may record at the same time,
  // and two writers truncating and filling one shared ".tmp" left a record
  // with another's tail after its end (seen in level1.flight.collectives).
  static std::atomic<std::uint64_t> serial{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(serial++);
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

}  // namespace

const char* to_string(Phase p) { return kPhases[static_cast<int>(p)]; }

Phase phase_from_string(const std::string& s) {
  for (int i = 0; i < 8; ++i) {
    if (s == kPhases[i]) return static_cast<Phase>(i);
  }
  return Phase::kSetup;
}

const char* to_string(State s) {
  switch (s) {
    case State::kIssued: return "issued";
    case State::kDone: return "done";
    case State::kFailed: return "failed";
  }
  return "?";
}

std::string describe(const Action& a) {
  std::string out;
  if (a.step >= 0) out = "step " + std::to_string(a.step) + ", ";
  out += to_string(a.phase);
  if (a.micro_batch >= 0) out += " of micro-batch " + std::to_string(a.micro_batch);
  if (a.chunk >= 0) out += ", chunk " + std::to_string(a.chunk);
  if (!a.where.empty()) out += " (" + a.where + ")";
  return out;
}

void set_action(const Action& a) {
  std::lock_guard<std::mutex> l(g_action_mu);
  const std::string where = g_action.where;
  g_action = a;
  if (a.where.empty()) g_action.where = where;
}

void set_phase(Phase p, int micro_batch, int chunk) {
  std::lock_guard<std::mutex> l(g_action_mu);
  g_action.phase = p;
  g_action.micro_batch = micro_batch;
  g_action.chunk = chunk;
}

void set_step(std::int64_t step) {
  std::lock_guard<std::mutex> l(g_action_mu);
  g_action.step = step;
}

void set_where(const std::string& where) {
  std::lock_guard<std::mutex> l(g_action_mu);
  g_action.where = where;
}

Action current_action() {
  std::lock_guard<std::mutex> l(g_action_mu);
  return g_action;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Recorder::Recorder(int rank, std::size_t capacity) : rank_(rank), ring_(std::max<std::size_t>(capacity, 1)) {}

void Recorder::add_group(const std::string& name, const std::vector<int>& members) {
  std::lock_guard<std::mutex> l(mu_);
  groups_[name].members = members;
}

std::uint64_t Recorder::issue(const std::string& group, const std::string& op, Kind kind, int peer,
                              std::uint64_t bytes) {
  const Action action = current_action();
  const double t = now_seconds();
  std::lock_guard<std::mutex> l(mu_);
  GroupProgress& g = groups_[group];
  const std::uint64_t id = next_id_++;
  const std::size_t slot = (id - 1) % ring_.size();
  Entry& e = ring_[slot];
  e.id = id;
  e.group = group;
  e.op = op;
  e.kind = kind;
  e.peer = peer;
  e.bytes = bytes;
  e.start = t;
  e.end = 0;
  e.state = State::kIssued;
  e.action = action;
  switch (kind) {
    case Kind::kCollective: e.seq = ++g.issued; break;
    case Kind::kSend: e.seq = ++g.sent[peer]; break;
    case Kind::kRecv: e.seq = ++g.posted[peer]; break;
  }
  if (kind != Kind::kSend && !g.pending) {  // the oldest in flight stays the one pending
    g.pending = true;
    g.current = e;
  }
  live_[id] = slot;
  return id;
}

void Recorder::finish(std::uint64_t id, bool ok) {
  const double t = now_seconds();
  std::lock_guard<std::mutex> l(mu_);
  auto it = live_.find(id);
  if (it == live_.end()) return;
  Entry& e = ring_[it->second];
  live_.erase(it);
  waited_sends_.erase(id);
  if (e.id != id) return;  // overwritten by a wrap-around while in flight
  e.end = t;
  e.state = ok ? State::kDone : State::kFailed;
  GroupProgress& g = groups_[e.group];
  if (ok && e.kind == Kind::kCollective) g.done = std::max(g.done, e.seq);
  if (ok && e.kind == Kind::kRecv) ++g.received[e.peer];
  if (g.pending && g.current.id == id) {
    if (!ok) {
      g.current.state = State::kFailed;
      return;
    }
    // Several operations may be in flight on a group (asynchronous ones):
    // the one now pending is the oldest still live.
    g.pending = false;
    for (const auto& [live_id, slot] : live_) {
      const Entry& o = ring_[slot];
      if (o.id == live_id && o.group == e.group && (o.kind != Kind::kSend || waited_sends_.count(live_id))) {
        g.pending = true;
        g.current = o;
        break;  // live_ is ordered by id: the first is the oldest
      }
    }
  }
}

void Recorder::waiting(std::uint64_t id) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = live_.find(id);
  if (it == live_.end()) return;
  const Entry& e = ring_[it->second];
  if (e.id != id || e.kind != Kind::kSend) return;
  waited_sends_.insert(id);
  GroupProgress& g = groups_[e.group];
  if (!g.pending) {
    g.pending = true;
    g.current = e;
  }
}

std::vector<Entry> Recorder::entries() const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<Entry> out;
  const std::uint64_t total = next_id_ - 1;
  const std::uint64_t n = std::min<std::uint64_t>(total, ring_.size());
  for (std::uint64_t id = total - n + 1; id <= total; ++id) out.push_back(ring_[(id - 1) % ring_.size()]);
  return out;
}

std::uint64_t Recorder::total_recorded() const {
  std::lock_guard<std::mutex> l(mu_);
  return next_id_ - 1;
}

Heartbeat Recorder::heartbeat() const {
  Heartbeat h;
  h.rank = rank_;
  h.time = now_seconds();
  h.action = current_action();
  std::lock_guard<std::mutex> l(mu_);
  h.groups = groups_;
  return h;
}

std::string to_json(const Heartbeat& h) { return heartbeat_json(h).dump(); }

Heartbeat heartbeat_from_json(const std::string& text) { return heartbeat_from(nlohmann::json::parse(text)); }

Entry entry_from_json(const std::string& text) { return entry_from(nlohmann::json::parse(text)); }

std::string record_json(const Recorder& r, const std::string& reason, double heartbeat_seconds) {
  nlohmann::json j;
  j["rank"] = r.rank();
  j["reason"] = reason;
  j["written"] = now_seconds();
  j["capacity"] = r.capacity();
  j["recorded"] = r.total_recorded();
  j["heartbeat_seconds"] = heartbeat_seconds;
  j["heartbeat"] = heartbeat_json(r.heartbeat());
  j["entries"] = nlohmann::json::array();
  for (const auto& e : r.entries()) j["entries"].push_back(entry_json(e));
  return j.dump(1);
}

// ---- Watchdog ----------------------------------------------------------------

Watchdog::Watchdog(std::shared_ptr<Recorder> recorder, WatchOptions options,
                   std::function<void(const std::string&)> report)
    : rec_(std::move(recorder)), o_(std::move(options)), report_(std::move(report)) {
  if (!report_) report_ = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  std::error_code ec;
  std::filesystem::create_directories(o_.dir, ec);
  // A record left by an earlier run in this directory would be misread as this run's.
  std::filesystem::remove(o_.dir + "/" + rank_file_name("", rec_->rank(), ".json"), ec);
  thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string Watchdog::dump(const std::string& reason) const {
  const std::string path = o_.dir + "/" + rank_file_name("", rec_->rank(), ".json");
  std::error_code ec;
  std::filesystem::create_directories(o_.dir, ec);
  write_atomically(path, record_json(*rec_, reason, o_.heartbeat_seconds));
  return std::filesystem::exists(path, ec) ? path : "";
}

void Watchdog::beat() const {
  write_atomically(o_.dir + "/" + rank_file_name("heartbeat-", rec_->rank(), ".json"), to_json(rec_->heartbeat()));
}

std::vector<std::string> Watchdog::check() const {
  std::vector<std::string> lines;
  const Heartbeat me = rec_->heartbeat();
  for (const auto& [name, g] : me.groups) {
    if (!g.pending || g.current.state != State::kIssued) continue;
    const double waited = me.time - g.current.start;
    if (waited < o_.stall_seconds) continue;
    if (reported_.count(name) && reported_[name] == g.current.id) continue;
    std::map<int, Heartbeat> others;
    for (int m : g.members) {
      if (m == me.rank) continue;
      std::ifstream in(o_.dir + "/" + rank_file_name("heartbeat-", m, ".json"));
      if (!in) continue;
      std::stringstream text;
      text << in.rdbuf();
      try {
        others[m] = heartbeat_from_json(text.str());
      } catch (const std::exception&) {
        // A beat being replaced: read again next pass.
      }
    }
    for (auto& line : diagnose(me, name, waited, others, me.time, o_.heartbeat_seconds)) lines.push_back(line);
    reported_[name] = g.current.id;
  }
  return lines;
}

void Watchdog::loop() {
  // Beat every heartbeat_seconds, and sooner (at most every tick) when the
  // action moved on, so a rank that stops is last seen close to where it stopped.
  const double tick = std::min(0.1, o_.heartbeat_seconds / 2);
  double last_beat = 0;
  Action last_action;
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    l.unlock();
    const double now = now_seconds();
    const Action a = current_action();
    const bool moved = a.step != last_action.step || a.phase != last_action.phase ||
                       a.micro_batch != last_action.micro_batch || a.chunk != last_action.chunk;
    if (now - last_beat >= o_.heartbeat_seconds || moved) {
      beat();
      last_beat = now;
      last_action = a;
    }
    for (const auto& line : check()) {
      report_(line);
      if (o_.abort_on_stall) {
        const std::string path = dump(line);
        std::fprintf(stderr, "rank %d: aborting on a stall (distributed.on_stall: abort); flight record written to %s\n",
                     rec_->rank(), path.c_str());
        std::fflush(stderr);
        std::_Exit(3);
      }
    }
    l.lock();
    cv_.wait_for(l, std::chrono::duration<double>(tick), [this] { return stop_; });
  }
}

}  // namespace hp::dist::flight
