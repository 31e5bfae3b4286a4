// The profiler's recorder and its Chrome trace-event files: nothing kept
// while off; spans nest per thread with begin <= end; one process track per
// rank; merged ranks keep exact nanosecond nesting on one time origin.
#include "hp/profile/trace.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

namespace fs = std::filesystem;
using nlohmann::json;

namespace hp::profile {
namespace {

class TraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    set_recording(false);
    take_events();
    dir_ = fs::temp_directory_path() /
           ("hp_trace_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    set_recording(false);
    take_events();
    fs::remove_all(dir_);
  }
  json read(const fs::path& p) {
    std::ifstream in(p);
    json j;
    in >> j;  // throws on invalid JSON
    return j;
  }
  fs::path dir_;
};

std::int64_t ns(const json& us) {
  return static_cast<std::int64_t>(us.get<double>() * 1000.0 + 0.5);
}

// The trace-event format's rules this project relies on: an object with a
// traceEvents array; every "X" event has a name, category, pid, tid and
// ts/dur >= 0 in µs; "M" metadata names each process once; and per (pid,
// tid) the spans nest (one either contains the next or ends before it
// starts). Returns the X events per pid.
std::map<int, std::vector<json>> check_format(const json& trace) {
  EXPECT_TRUE(trace.is_object());
  EXPECT_TRUE(trace.at("traceEvents").is_array());
  EXPECT_EQ(trace.value("displayTimeUnit", ""), "ms");
  std::map<int, std::vector<json>> spans;
  std::map<int, int> process_names;
  for (const json& e : trace.at("traceEvents")) {
    const std::string ph = e.at("ph").get<std::string>();
    if (ph == "M") {
      if (e.at("name") == "process_name") {
        process_names[e.at("pid").get<int>()] += 1;
        EXPECT_TRUE(e.at("args").at("name").is_string());
      }
      continue;
    }
    EXPECT_EQ(ph, "X") << e.dump();
    EXPECT_TRUE(e.at("name").is_string());
    EXPECT_TRUE(e.at("cat").is_string());
    EXPECT_TRUE(e.at("args").is_object());
    EXPECT_GE(e.at("ts").get<double>(), 0.0);
    EXPECT_GE(e.at("dur").get<double>(), 0.0);
    spans[e.at("pid").get<int>()].push_back(e);
  }
  for (const auto& [pid, list] : spans) {
    EXPECT_EQ(process_names[pid], 1) << "process " << pid << " must be named exactly once";
    std::map<int, std::vector<const json*>> by_thread;
    for (const json& e : list) by_thread[e.at("tid").get<int>()].push_back(&e);
    for (auto& [tid, events] : by_thread) {
      std::stable_sort(events.begin(), events.end(), [](const json* a, const json* b) {
        if (ns(a->at("ts")) != ns(b->at("ts"))) return ns(a->at("ts")) < ns(b->at("ts"));
        return ns(a->at("dur")) > ns(b->at("dur"));
      });
      std::vector<std::int64_t> open_ends;
      for (const json* e : events) {
        const std::int64_t b = ns(e->at("ts")), end = b + ns(e->at("dur"));
        while (!open_ends.empty() && open_ends.back() <= b) open_ends.pop_back();
        if (!open_ends.empty()) {
          EXPECT_LE(end, open_ends.back())
              << "span " << e->dump() << " overlaps its parent on pid " << pid << " tid " << tid;
        }
        open_ends.push_back(end);
      }
    }
  }
  return spans;
}

TEST_F(TraceTest, OffRecordsNothing) {
  {
    Span s("compute", "forward");
    s.arg("mb", 1).arg("group", std::string("dp")).arg("what", "x");
    EXPECT_FALSE(s.active());
    s.end();
  }
  EXPECT_EQ(pending_events(), 0u);
  EXPECT_TRUE(take_events().empty());
}

TEST_F(TraceTest, OnRecordsNestedSpansWithArgs) {
  set_recording(true);
  {
    Span step("step", "step");
    step.arg("step", 3);
    {
      Span fwd("compute", "forward");
      fwd.arg("mb", 0).arg("action", "F0.0");
      Span comm("comm", std::string("all_reduce"));
      comm.arg("group", std::string("dp")).arg("bytes", std::uint64_t{4096});
    }
    Span bwd("compute", "backward");
    bwd.end();
    bwd.end();  // a second end is a no-op
  }
  set_recording(false);
  { Span after("compute", "forward"); }
  auto events = take_events();
  ASSERT_EQ(events.size(), 4u);
  std::map<std::string, Event> by_name;
  for (const auto& e : events) {
    EXPECT_LE(e.begin_ns, e.end_ns);
    by_name[e.name] = e;
  }
  EXPECT_LE(by_name["step"].begin_ns, by_name["forward"].begin_ns);
  EXPECT_LE(by_name["forward"].end_ns, by_name["backward"].begin_ns);
  EXPECT_LE(by_name["backward"].end_ns, by_name["step"].end_ns);
  EXPECT_LE(by_name["all_reduce"].end_ns, by_name["forward"].end_ns);
  ASSERT_EQ(by_name["all_reduce"].args.size(), 2u);
  EXPECT_EQ(by_name["all_reduce"].args[0].text, "dp");
  EXPECT_EQ(by_name["all_reduce"].args[1].number, 4096);

  write_rank_trace((dir_ / "rank.json").string(), 2, "rank 2 (pp 1)", events);
  const json trace = read(dir_ / "rank.json");
  auto spans = check_format(trace);
  ASSERT_EQ(spans.size(), 1u);
  ASSERT_EQ(spans.count(2), 1u);
  EXPECT_EQ(spans[2].size(), 4u);
  EXPECT_EQ(spans[2].front().at("name"), "step");  // parents first
  EXPECT_EQ(spans[2].front().at("ts").get<double>(), 0.0);
  EXPECT_EQ(spans[2].front().at("args").at("step"), 3);
  EXPECT_EQ(trace.at("otherData").at("rank"), 2);
}

TEST_F(TraceTest, ThreadsGetTheirOwnTracks) {
  set_recording(true);
  {
    Span outer("step", "step");
    std::thread worker([] {
      Span a("checkpoint", "write");
      Span b("comm", "send_wait");
    });
    worker.join();
  }
  set_recording(false);
  auto events = take_events();
  ASSERT_EQ(events.size(), 3u);
  std::set<int> threads;
  for (const auto& e : events) threads.insert(e.thread);
  EXPECT_EQ(threads.size(), 2u);
  write_rank_trace((dir_ / "rank.json").string(), 0, "rank 0", events);
  const json trace = read(dir_ / "rank.json");
  check_format(trace);
  int thread_names = 0;
  for (const json& e : trace["traceEvents"]) thread_names += e["name"] == "thread_name" ? 1 : 0;
  EXPECT_EQ(thread_names, 2);
}

// Hand-made events with known times: rank 1 starts 5 ms after rank 0, and
// its spans nest down to the nanosecond.
TEST_F(TraceTest, MergeKeepsOneTrackPerRankOnOneOrigin) {
  const std::int64_t t0 = 1'700'000'000'123'456'789;
  std::vector<Event> r0{{"step", "step", t0, t0 + 10'000'000, 0, {}},
                        {"forward", "compute", t0 + 1, t0 + 4'000'001, 0, {{"mb", "", 0, true}}}};
  std::vector<Event> r1{
      {"step", "step", t0 + 5'000'000, t0 + 9'000'000, 0, {}},
      {"forward", "compute", t0 + 5'000'000, t0 + 6'000'001, 0, {}},
      {"all_reduce", "comm", t0 + 6'000'000, t0 + 6'000'001, 0, {{"group", "dp", 0, false}}}};
  write_rank_trace((dir_ / "trace" / "rank00000.json").string(), 0, "rank 0", r0);
  write_rank_trace((dir_ / "trace" / "rank00001.json").string(), 1, "rank 1", r1);
  const auto missing = merge_traces(
      {(dir_ / "trace" / "rank00000.json").string(), (dir_ / "trace" / "rank00001.json").string(),
       (dir_ / "trace" / "rank00002.json").string()},
      (dir_ / "trace.json").string());
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_NE(missing[0].find("rank00002.json"), std::string::npos);
  const json merged = read(dir_ / "trace.json");
  auto spans = check_format(merged);
  ASSERT_EQ(spans.size(), 2u);
  ASSERT_EQ(spans[1].size(), 3u);
  EXPECT_EQ(merged.at("otherData").at("origin_unix_ns").get<std::int64_t>(), t0);
  std::map<std::string, json> r1_by_name;
  for (const auto& e : spans[1]) r1_by_name[e["name"]] = e;
  EXPECT_EQ(ns(r1_by_name["step"]["ts"]), 5'000'000);
  EXPECT_EQ(ns(r1_by_name["forward"]["dur"]), 1'000'001);
  EXPECT_EQ(ns(r1_by_name["all_reduce"]["ts"]), 6'000'000);
  EXPECT_EQ(r1_by_name["all_reduce"]["args"]["group"], "dp");
  std::map<std::string, json> r0_by_name;
  for (const auto& e : spans[0]) r0_by_name[e["name"]] = e;
  EXPECT_EQ(ns(r0_by_name["forward"]["ts"]), 1);
}

TEST_F(TraceTest, MergeRefusesAFileThatIsNotARankTrace) {
  std::ofstream(dir_ / "bad.json") << "{\"traceEvents\": [";
  try {
    merge_traces({(dir_ / "bad.json").string()}, (dir_ / "trace.json").string());
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.json is not a rank trace"), std::string::npos)
        << e.what();
  }
}

TEST_F(TraceTest, UnwritableFileIsNamed) {
  std::ofstream(dir_ / "file") << "x";
  try {
    write_rank_trace((dir_ / "file" / "rank.json").string(), 0, "rank 0", {});
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot write the trace file"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace hp::profile
