// The flight recorder: the ring (wrap-around, concurrent writers), the
// heartbeat round trip, the comparison that finds the rank behind and the
// mismatch, and the exact message formats.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "backends/comm/flight_analysis.h"
#include "hp/comm/flight_recorder.h"

namespace flight = hp::dist::flight;

TEST(FlightRing, WrapsAroundKeepingTheNewest) {
  flight::Recorder r(0, 4);
  r.add_group("dp", {0, 1});
  for (int i = 0; i < 10; ++i) r.finish(r.issue("dp", "all_reduce", flight::Kind::kCollective, -1, 8), true);
  auto e = r.entries();
  ASSERT_EQ(e.size(), 4u);
  EXPECT_EQ(e.front().seq, 7u);
  EXPECT_EQ(e.back().seq, 10u);
  EXPECT_EQ(e.back().state, flight::State::kDone);
  EXPECT_EQ(r.total_recorded(), 10u);
  auto hb = r.heartbeat();
  EXPECT_EQ(hb.groups.at("dp").issued, 10u);
  EXPECT_EQ(hb.groups.at("dp").done, 10u);
  EXPECT_FALSE(hb.groups.at("dp").pending);
}

TEST(FlightRing, ConcurrentWritersLoseNothingAndKeepSequencesPerGroup) {
  flight::Recorder r(0, 64);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&r, t] {
      const std::string g = "g" + std::to_string(t);
      for (int i = 0; i < 500; ++i) r.finish(r.issue(g, "all_reduce", flight::Kind::kCollective, -1, 4), i % 7 != 0);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(r.total_recorded(), 2000u);
  auto hb = r.heartbeat();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(hb.groups.at("g" + std::to_string(t)).issued, 500u);
  auto e = r.entries();
  ASSERT_EQ(e.size(), 64u);
  for (std::size_t i = 1; i < e.size(); ++i) EXPECT_EQ(e[i].id, e[i - 1].id + 1);
}

TEST(FlightRing, PointToPointCountsPerPeerAndAPendingReceive) {
  flight::Recorder r(1, 16);
  r.add_group("pp", {0, 1});
  flight::set_action({3, flight::Phase::kForward, 2, 1, "pipeline stage 1"});
  r.finish(r.issue("pp", "send", flight::Kind::kSend, 0, 100), true);
  r.finish(r.issue("pp", "recv", flight::Kind::kRecv, 0, 0), true);
  const auto id = r.issue("pp", "recv", flight::Kind::kRecv, 0, 0);
  auto hb = r.heartbeat();
  const auto& g = hb.groups.at("pp");
  EXPECT_EQ(g.sent.at(0), 1u);
  EXPECT_EQ(g.received.at(0), 1u);
  ASSERT_TRUE(g.pending);
  EXPECT_EQ(g.current.seq, 2u) << "the second receive from member 0";
  EXPECT_EQ(flight::describe(g.current.action), "step 3, forward of micro-batch 2, chunk 1 (pipeline stage 1)");
  r.finish(id, false);
  EXPECT_EQ(r.heartbeat().groups.at("pp").current.state, flight::State::kFailed);
  flight::set_action({});
  flight::set_where("");
}

TEST(FlightHeartbeat, JsonRoundTrip) {
  flight::Recorder r(2, 8);
  r.add_group("tp", {2, 3});
  flight::set_action({7, flight::Phase::kBackward, 1, -1, ""});
  r.issue("tp", "all_reduce", flight::Kind::kCollective, -1, 64);
  auto back = flight::heartbeat_from_json(flight::to_json(r.heartbeat()));
  EXPECT_EQ(back.rank, 2);
  EXPECT_EQ(flight::describe(back.action), "step 7, backward of micro-batch 1");
  EXPECT_EQ(back.groups.at("tp").members, (std::vector<int>{2, 3}));
  EXPECT_TRUE(back.groups.at("tp").pending);
  EXPECT_EQ(back.groups.at("tp").current.op, "all_reduce");
  EXPECT_EQ(back.groups.at("tp").current.bytes, 64u);
  flight::set_action({});
}

namespace {

/// A heartbeat of `rank` at time `t`, in `action`, with the dp group
/// [0, 1] having entered `issued` collectives and (optionally) pending in
/// op #issued since `since`.
flight::Heartbeat beat(int rank, double t, flight::Action action, std::uint64_t issued, const std::string& pending_op,
                       double since = 0, std::uint64_t bytes = 4096) {
  flight::Heartbeat h;
  h.rank = rank;
  h.time = t;
  h.action = action;
  flight::GroupProgress g;
  g.members = {0, 1};
  g.issued = issued;
  g.done = pending_op.empty() ? issued : issued - 1;
  if (!pending_op.empty()) {
    g.pending = true;
    g.current.group = "dp";
    g.current.op = pending_op;
    g.current.kind = flight::Kind::kCollective;
    g.current.seq = issued;
    g.current.bytes = bytes;
    g.current.start = since;
    g.current.action = action;
  }
  h.groups["dp"] = g;
  return h;
}

}  // namespace

TEST(FlightDiagnosis, NamesTheRankBehindWithItsActionAndHeartbeatAge) {
  auto me = beat(0, 100.0, {29, flight::Phase::kGradSync}, 57, "all_reduce", 88.0);
  auto other = beat(1, 99.6, {29, flight::Phase::kBackward, 1}, 56, "");
  auto lines = flight::diagnose(me, "dp", 12.0, {{1, other}}, 100.0, 1.0);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "stall on group 'dp': rank 1 has not entered all_reduce #57 (it is in step 29, backward of micro-batch 1; "
            "last heartbeat 0.4 s ago); rank 0 has waited 12.0 s in all_reduce (step 29, gradient sync)");
}

TEST(FlightDiagnosis, AStoppedHeartbeatIsNamedAsSuch) {
  auto me = beat(0, 100.0, {29, flight::Phase::kGradSync}, 57, "all_reduce", 88.0);
  auto other = beat(1, 88.0, {29, flight::Phase::kBackward, 1}, 56, "");
  auto lines = flight::diagnose(me, "dp", 12.0, {{1, other}}, 100.0, 1.0);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "stall on group 'dp': rank 1 has not entered all_reduce #57 and its heartbeat stopped (last seen in step "
            "29, backward of micro-batch 1; last heartbeat 12.0 s ago); rank 0 has waited 12.0 s in all_reduce (step "
            "29, gradient sync)");
  auto none = flight::diagnose(me, "dp", 12.0, {}, 100.0, 1.0);
  ASSERT_EQ(none.size(), 1u);
  EXPECT_EQ(none[0], "stall on group 'dp': rank 1 has not entered all_reduce #57 and has never sent a heartbeat; rank 0 "
                     "has waited 12.0 s in all_reduce (step 29, gradient sync)");
}

TEST(FlightDiagnosis, AnOperationIssuedAheadSaysWhereItWasIssuedAndWhereTheRankIsNow) {
  // A bucket's all-reduce launched during backward, waited in gradient sync.
  auto me = beat(0, 100.0, {29, flight::Phase::kBackward, 3}, 57, "all_reduce", 88.0);
  me.action = {29, flight::Phase::kGradSync};
  auto other = beat(1, 99.6, {29, flight::Phase::kBackward, 1}, 56, "");
  auto lines = flight::diagnose(me, "dp", 12.0, {{1, other}}, 100.0, 1.0);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "stall on group 'dp': rank 1 has not entered all_reduce #57 (it is in step 29, backward of micro-batch 1; "
            "last heartbeat 0.4 s ago); rank 0 has waited 12.0 s in all_reduce (issued in step 29, backward of "
            "micro-batch 3; now in step 29, gradient sync)");
}

TEST(FlightDiagnosis, DifferentCallsAtOneSequenceNumberAreAMismatch) {
  auto me = beat(0, 100.0, {3, flight::Phase::kForward, 0}, 5, "all_reduce", 97.0);
  auto other = beat(1, 99.9, {3, flight::Phase::kForward, 0}, 5, "broadcast", 97.0);
  auto lines = flight::diagnose(me, "dp", 3.0, {{1, other}}, 100.0, 1.0);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "collective mismatch on group 'dp' #5: rank 0 calls all_reduce (4096 bytes), rank 1 calls broadcast (4096 "
            "bytes)");
}

TEST(FlightDiagnosis, EveryoneInTheSameCallIsATransportWait) {
  auto me = beat(0, 100.0, {3, flight::Phase::kGradSync}, 5, "all_reduce", 90.0);
  auto other = beat(1, 99.9, {3, flight::Phase::kGradSync}, 5, "all_reduce", 90.0);
  auto lines = flight::diagnose(me, "dp", 10.0, {{1, other}}, 100.0, 1.0);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "stall on group 'dp': every member is in all_reduce #5 for 10.0 s (waiting on the transport)");
}

TEST(FlightDiagnosis, AMemberFrozenInsideTheCallIsNamedNotTheTransport) {
  // Rank 1 entered all_reduce #5 and was then stopped (SIGSTOP, a debugger):
  // it is in the call, but its beats stopped 10 s ago.
  auto me = beat(0, 100.0, {3, flight::Phase::kGradSync}, 5, "all_reduce", 90.0);
  auto other = beat(1, 90.0, {3, flight::Phase::kGradSync}, 5, "all_reduce", 90.0);
  auto lines = flight::diagnose(me, "dp", 10.0, {{1, other}}, 100.0, 1.0);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "stall on group 'dp': rank 1 entered all_reduce #5 but its heartbeat stopped (last seen in step 3, "
            "gradient sync; last heartbeat 10.0 s ago); rank 0 has waited 10.0 s in all_reduce (step 3, gradient "
            "sync)");
}

namespace {
/// Stage 1 (rank 1, heartbeat at t=50) waits in recv #6 from stage 0 for
/// 4 s; stage 0 (rank 0) has sent `sent` messages to it, last beat at
/// `peer_time`, and is in `peer_action`.
std::pair<flight::Heartbeat, flight::Heartbeat> stage_receive(std::uint64_t sent, double peer_time,
                                                              flight::Action peer_action) {
  flight::Heartbeat me;
  me.rank = 1;
  me.time = 50.0;
  flight::GroupProgress g;
  g.members = {0, 1};
  g.pending = true;
  g.current = flight::Entry{};
  g.current.op = "recv";
  g.current.kind = flight::Kind::kRecv;
  g.current.peer = 0;
  g.current.seq = 6;
  g.current.action = {4, flight::Phase::kForward, 5, 1, "pipeline stage 1"};
  me.action = g.current.action;  // waiting where it posted the receive
  me.groups["pp"] = g;
  flight::Heartbeat peer;
  peer.rank = 0;
  peer.time = peer_time;
  peer.action = std::move(peer_action);
  flight::GroupProgress pg;
  pg.members = {0, 1};
  pg.sent[1] = sent;
  peer.groups["pp"] = pg;
  return {me, peer};
}
}  // namespace

TEST(FlightDiagnosis, AStageReceiveNamesThePeerThatHasNotSent) {
  auto [me, peer] = stage_receive(5, 49.5, {4, flight::Phase::kBackward, 2, 0, "pipeline stage 0"});
  auto lines = flight::diagnose(me, "pp", 4.0, {{0, peer}}, 50.0, 1.0);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "stall on group 'pp': rank 0 has not sent message #6 to rank 1 (it is in step 4, backward of micro-batch 2, "
            "chunk 0 (pipeline stage 0); last heartbeat 0.5 s ago); rank 1 has waited 4.0 s in recv (step 4, forward "
            "of micro-batch 5, chunk 1 (pipeline stage 1))");
}

// A message the sender posted but that never arrived: with the sender's
// heartbeat stopped (a frozen process holds the transfer), the sender is
// named; with it alive, the transport is.
TEST(FlightDiagnosis, APostedMessageFromAFrozenSenderNamesTheSender) {
  auto [me, peer] = stage_receive(6, 46.0, {4, flight::Phase::kForward, 6, 0, "pipeline stage 0"});
  auto lines = flight::diagnose(me, "pp", 4.0, {{0, peer}}, 50.0, 1.0);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "stall on group 'pp': rank 0 posted message #6 to rank 1 but it never arrived and its heartbeat stopped "
            "(last seen in step 4, forward of micro-batch 6, chunk 0 (pipeline stage 0); last heartbeat 4.0 s ago); "
            "rank 1 has waited 4.0 s in recv (step 4, forward of micro-batch 5, chunk 1 (pipeline stage 1))");
  peer.time = 49.8;
  lines = flight::diagnose(me, "pp", 4.0, {{0, peer}}, 50.0, 1.0);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "stall on group 'pp': rank 0 sent message #6 to rank 1, still in transit after 4.0 s");
}

// A send the rank blocks on (Gloo hands a message over only when the
// receiver asks for it) becomes the group's pending operation, so the stage
// that finished its schedule and waits for its last send to be taken still
// reports the frozen receiver; a send only posted does not hide a receive.
TEST(FlightDiagnosis, ASendTheRankWaitsOnNamesTheReceiver) {
  flight::Recorder r(1, 16);
  r.add_group("pp", {0, 1});
  flight::set_action({6, flight::Phase::kBackward, 15, 1, "pipeline stage 1"});
  const auto posted = r.issue("pp", "send", flight::Kind::kSend, 0, 4096);
  EXPECT_FALSE(r.heartbeat().groups.at("pp").pending) << "a posted send is not what the rank waits on";
  r.waiting(posted);
  auto me = r.heartbeat();
  ASSERT_TRUE(me.groups.at("pp").pending);
  EXPECT_EQ(me.groups.at("pp").current.kind, flight::Kind::kSend);
  EXPECT_EQ(me.groups.at("pp").current.seq, 1u);
  flight::Heartbeat peer;
  peer.rank = 0;
  peer.time = me.time - 3.0;
  peer.action = {6, flight::Phase::kBackward, 14, 0, "pipeline stage 0"};
  peer.groups["pp"].members = {0, 1};
  auto lines = flight::diagnose(me, "pp", 3.0, {{0, peer}}, me.time, 0.5);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].rfind("stall on group 'pp': rank 0 has not received message #1 from rank 1 and its heartbeat "
                           "stopped (last seen in step 6, backward of micro-batch 14, chunk 0 (pipeline stage 0); "
                           "last heartbeat 3.0 s ago); rank 1 has waited ", 0), 0u)
      << lines[0];
  // Taken: nothing pending; a receive issued after a waited send that
  // completed is what the group shows next.
  r.finish(posted, true);
  EXPECT_FALSE(r.heartbeat().groups.at("pp").pending);
  const auto s2 = r.issue("pp", "send", flight::Kind::kSend, 0, 4096);
  const auto rv = r.issue("pp", "recv", flight::Kind::kRecv, 0, 0);
  r.waiting(s2);
  EXPECT_EQ(r.heartbeat().groups.at("pp").current.kind, flight::Kind::kRecv) << "the receive was pending first";
  r.finish(rv, true);
  EXPECT_EQ(r.heartbeat().groups.at("pp").current.kind, flight::Kind::kSend) << "then the send still waited on";
  r.finish(s2, true);
  flight::set_action({});
  flight::set_where("");
}

// The watchdog itself, on files: it reads the other rank's heartbeat and
// reports the stall once; the record it dumps parses back.
TEST(FlightWatchdog, ReportsOnceAndDumpsARecord) {
  const std::string dir = (std::filesystem::temp_directory_path() / "hp_flight_ut").string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto other = beat(1, flight::now_seconds(), {8, flight::Phase::kBackward, 0}, 2, "");
  std::ofstream(dir + "/heartbeat-rank00001.json") << flight::to_json(other);
  auto rec = std::make_shared<flight::Recorder>(0, 32);
  rec->add_group("dp", {0, 1});
  for (int i = 0; i < 2; ++i) rec->finish(rec->issue("dp", "all_reduce", flight::Kind::kCollective, -1, 4096), true);
  rec->issue("dp", "all_reduce", flight::Kind::kCollective, -1, 4096);
  std::vector<std::string> reported;
  std::mutex m;
  flight::WatchOptions o;
  o.dir = dir;
  o.heartbeat_seconds = 0.1;
  o.stall_seconds = 0.3;
  {
    flight::Watchdog w(rec, o, [&](const std::string& l) {
      std::lock_guard<std::mutex> g(m);
      reported.push_back(l);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(900));
    const std::string path = w.dump("test");
    std::ifstream in(path);
    EXPECT_TRUE(in.good());
  }
  ASSERT_EQ(reported.size(), 1u) << "reported once per operation";
  EXPECT_NE(reported[0].find("stall on group 'dp': rank 1 has not entered all_reduce #3"), std::string::npos)
      << reported[0];
  EXPECT_TRUE(std::filesystem::exists(dir + "/heartbeat-rank00000.json"));
  std::filesystem::remove_all(dir);
}

// The watchdog (a stall), the stop thread (SIGTERM) and a failing main
// thread may each write rank<RRRRR>.json at the same moment: every record on
// disk is one whole record, never one writer's text with another's tail.
TEST(FlightWatchdog, RecordsWrittenAtOnceFromManyThreadsStayWhole) {
  const std::string dir = (std::filesystem::temp_directory_path() / "hp_flight_ut_race").string();
  std::filesystem::remove_all(dir);
  auto rec = std::make_shared<flight::Recorder>(0, 32);
  rec->add_group("dp", {0, 1});
  for (int i = 0; i < 20; ++i) rec->finish(rec->issue("dp", "all_reduce", flight::Kind::kCollective, -1, 4096), true);
  flight::WatchOptions o;
  o.dir = dir;
  o.heartbeat_seconds = 10;
  o.stall_seconds = 100;
  flight::Watchdog w(rec, o, [](const std::string&) {});
  std::vector<std::thread> writers;
  for (int t = 0; t < 4; ++t) {
    writers.emplace_back([&, t] {
      // Reasons of very different lengths, so a shorter record over a longer one shows.
      for (int i = 0; i < 50; ++i) w.dump(std::string(static_cast<std::size_t>(1 + (t * 997 + i * 131) % 3000), 'x'));
    });
  }
  // Every read while they write finds one whole record (or none yet).
  std::atomic<bool> done{false};
  std::atomic<int> broken{0};
  std::thread reader([&] {
    while (!done) {
      std::ifstream r(dir + "/rank00000.json");
      if (!r.good()) continue;
      std::stringstream t;
      t << r.rdbuf();
      if (!nlohmann::json::accept(t.str())) ++broken;
    }
  });
  for (auto& th : writers) th.join();
  done = true;
  reader.join();
  EXPECT_EQ(broken.load(), 0) << "reads found a record that is not one whole JSON document";
  std::ifstream in(dir + "/rank00000.json");
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NO_THROW((void)nlohmann::json::parse(text.str())) << "the record on disk is not one whole JSON document";
  std::size_t leftovers = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) leftovers += e.path().string().find(".tmp") != std::string::npos;
  EXPECT_EQ(leftovers, 0u) << "temporary files left behind";
  std::filesystem::remove_all(dir);
}
