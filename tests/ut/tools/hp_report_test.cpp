// hp-report's page builder: the plotted points are the input rows, text from
// the run is escaped, and absent figures leave no empty chart behind.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "framework/report/report.h"

namespace hp::report {
namespace {

std::vector<Row> parse(const std::string& text) {
  std::istringstream in(text);
  return parse_metrics(in, "metrics.jsonl");
}

using Point = std::tuple<std::string, std::int64_t, double>;

// Every <circle data-key data-step data-value> of the page.
std::multiset<Point> plotted(const std::string& html) {
  static const std::regex circle(R"re(<circle [^>]*data-key="([^"]*)" data-step="(-?\d+)" data-value="([^"]*)")re");
  std::multiset<Point> out;
  for (std::sregex_iterator it(html.begin(), html.end(), circle), end; it != end; ++it) {
    out.emplace((*it)[1].str(), std::stoll((*it)[2].str()), std::stod((*it)[3].str()));
  }
  return out;
}

const Chart* chart(const std::vector<Chart>& charts, const std::string& id) {
  for (const Chart& c : charts) {
    if (c.id == id) return &c;
  }
  return nullptr;
}

// A 2-stage pipeline run with tensor parallel and an evaluation at step 3.
const char* kRun =
    R"({"step":1,"loss":5.675265550613403,"lr":6.666666666666667e-05,"grad_norm":7.882222125861655,"tokens_per_second":7364.914742247349,"step_seconds":0.278075181,"comm_bytes":1024.0,"comm_seconds":0.012158318,"comm_bytes_pp_send":512.0,"comm_seconds_pp_send":0.002,"comm_bytes_tp_all_reduce":512.0,"comm_seconds_tp_all_reduce":0.010158318,"peak_resident_memory_bytes":325443584.0,"pipeline_idle_fraction":0.25,"pipeline_idle_fraction_stage0":0.25,"pipeline_idle_fraction_stage1":0.125,"pipeline_wait_seconds":0.01,"tokens_per_expert_expert0":10,"tokens_per_expert_expert1":6,"time":1796069389.7097528}
{"step":2,"loss":3.1948635578155518,"lr":0.0013333333333333333,"grad_norm":null,"tokens_per_second":9081.1467775023,"step_seconds":0.225522178,"comm_bytes":1024.0,"comm_seconds":0.01,"comm_bytes_pp_send":512.0,"comm_seconds_pp_send":0.0015,"comm_bytes_tp_all_reduce":512.0,"comm_seconds_tp_all_reduce":0.0085,"peak_resident_memory_bytes":362569728.0,"pipeline_idle_fraction":0.2,"pipeline_idle_fraction_stage0":0.2,"pipeline_idle_fraction_stage1":0.1,"pipeline_wait_seconds":0.008,"tokens_per_expert_expert0":8,"tokens_per_expert_expert1":8,"time":1796069394.19}

{"step":3,"loss":2.6583331823349,"eval_loss":2.8852568864822388,"lr":0.001629006727063226,"grad_norm":0.8067177101726023,"tokens_per_second":8793.432477252178,"step_seconds":0.232901089,"comm_bytes":1024.0,"comm_seconds":0.009,"comm_bytes_pp_send":512.0,"comm_seconds_pp_send":0.001,"comm_bytes_tp_all_reduce":512.0,"comm_seconds_tp_all_reduce":0.008,"peak_resident_memory_bytes":365772800.0,"pipeline_idle_fraction":0.3,"pipeline_idle_fraction_stage0":0.3,"pipeline_idle_fraction_stage1":0.0,"pipeline_wait_seconds":0.012,"tokens_per_expert_expert0":7,"tokens_per_expert_expert1":9,"custom_figure":42,"time":1796069398.9146845}
)";

TEST(HpReport, ParsesRows) {
  const std::vector<Row> rows = parse(kRun);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].step, 1);
  EXPECT_EQ(rows[0].values.count("time"), 0u) << "wall time is not a figure";
  EXPECT_EQ(*rows[0].values.at("loss"), 5.675265550613403);
  EXPECT_FALSE(rows[1].values.at("grad_norm").has_value()) << "null (NaN in the trainer) stays empty";
  EXPECT_EQ(rows[1].values.count("eval_loss"), 0u);
  EXPECT_EQ(*rows[2].values.at("eval_loss"), 2.8852568864822388);
}

TEST(HpReport, UnfinishedLastLineIsSkippedOtherBadLinesRefused) {
  EXPECT_EQ(parse("{\"step\":1,\"loss\":2}\n{\"step\":2,\"lo").size(), 1u);
  try {
    parse("{\"step\":1,\"loss\":2}\n{\"loss\":3}\n{\"step\":3}\n");
    ADD_FAILURE() << "a line without step was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(),
                 "metrics.jsonl:2: not a JSON object with an integer \"step\" (is this a metrics.jsonl "
                 "written by hp-train?)");
  }
  EXPECT_THROW(parse("garbage\n{\"step\":1}\n"), std::runtime_error);
}

// Every circle is a (key, step, value) of the input, and every non-null
// value of a plotted key has its circle: nothing dropped, nothing rounded.
TEST(HpReport, PointsEqualInputRows) {
  const std::vector<Row> rows = parse(kRun);
  const std::string html = render_report({"runs/x", rows, std::nullopt});
  const std::multiset<Point> points = plotted(html);
  std::multiset<Point> expected;
  for (const Row& row : rows) {
    for (const auto& [key, value] : row.values) {
      // The logging rank's own idle fraction is plotted as its stage.
      if (value && key != "pipeline_idle_fraction") expected.emplace(key, row.step, *value);
    }
  }
  EXPECT_EQ(points, expected);
  EXPECT_EQ(points.count({"eval_loss", 3, 2.8852568864822388}), 1u);
  EXPECT_EQ(points.count({"lr", 1, 6.666666666666667e-05}), 1u);
  EXPECT_NE(html.find("data-value=\"6.666666666666667e-05\""), std::string::npos);
}

TEST(HpReport, ChartsGroupFiguresByGroupStageAndExpert) {
  const std::vector<Chart> charts = plan_charts(parse(kRun));
  const Chart* loss = chart(charts, "chart-loss");
  ASSERT_NE(loss, nullptr);
  ASSERT_EQ(loss->series.size(), 2u);
  EXPECT_EQ(loss->series[1].key, "eval_loss");
  EXPECT_EQ(loss->series[1].points.size(), 1u);
  const Chart* bytes = chart(charts, "chart-comm-bytes");
  ASSERT_NE(bytes, nullptr);
  std::vector<std::string> labels;
  for (const auto& s : bytes->series) labels.push_back(s.label);
  EXPECT_EQ(labels, (std::vector<std::string>{"pp send", "tp all_reduce", "all groups"}));
  EXPECT_EQ(bytes->unit, "bytes");
  const Chart* idle = chart(charts, "chart-stage-pipeline_idle_fraction");
  ASSERT_NE(idle, nullptr);
  EXPECT_EQ(idle->title, "Pipeline idle fraction per stage");
  ASSERT_EQ(idle->series.size(), 2u);
  EXPECT_EQ(idle->series[1].label, "stage 1");
  const Chart* experts = chart(charts, "chart-expert-tokens_per_expert");
  ASSERT_NE(experts, nullptr);
  EXPECT_EQ(experts->series.size(), 2u);
  EXPECT_NE(chart(charts, "chart-memory"), nullptr);
  EXPECT_NE(chart(charts, "chart-key-custom_figure"), nullptr) << "an unknown figure still gets a chart";
  EXPECT_EQ(chart(charts, "chart-grad-norm")->series[0].points.size(), 2u) << "the null step is left out";
}

TEST(HpReport, ConfigAndRunTextIsEscaped) {
  const std::string yaml = "run:\n  name: \"<script>alert('x')</script> & co\"\n";
  const std::string html = render_report({"runs/<b>\"dir\"", parse(kRun), yaml});
  EXPECT_EQ(html.find("<script>"), std::string::npos);
  EXPECT_EQ(html.find("<b>"), std::string::npos);
  EXPECT_NE(html.find("name: &quot;&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; co&quot;"),
            std::string::npos);
  EXPECT_NE(html.find("runs/&lt;b&gt;&quot;dir&quot;"), std::string::npos);
  EXPECT_EQ(html_escape("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&#39;");
}

TEST(HpReport, MissingKeysLeaveNoEmptyChart) {
  const std::vector<Row> rows = parse("{\"step\":5,\"loss\":1.5}\n{\"step\":6,\"loss\":1.25,\"grad_norm\":null}\n");
  const std::vector<Chart> charts = plan_charts(rows);
  ASSERT_EQ(charts.size(), 1u) << "only the loss has values";
  EXPECT_EQ(charts[0].id, "chart-loss");
  EXPECT_EQ(charts[0].series.size(), 1u);
  const std::string html = render_report({"r", rows, std::nullopt});
  EXPECT_EQ(plotted(html).size(), 2u);
  EXPECT_NE(html.find("No config.yaml in the run directory."), std::string::npos);
  EXPECT_NE(html.find("<td>grad_norm</td><td class=\"num\">6</td><td class=\"num\">null</td>"), std::string::npos);

  const std::string empty = render_report({"r", {}, std::nullopt});
  EXPECT_NE(empty.find("metrics.jsonl has no logged step yet."), std::string::npos);
  EXPECT_EQ(empty.find("<svg"), std::string::npos);

  // One point: the axes still have a range.
  const std::string one = render_report({"r", parse("{\"step\":1,\"loss\":0}\n"), std::nullopt});
  EXPECT_EQ(plotted(one).size(), 1u);
  EXPECT_EQ(one.find("nan"), std::string::npos);
  EXPECT_EQ(one.find("inf"), std::string::npos);
}

TEST(HpReport, ExactNumbersReadBack) {
  for (double v : {0.1, 1.0 / 3.0, 5.675265550613403, 6.666666666666667e-05, 13293576.0, -2.5e-300, 0.0}) {
    EXPECT_EQ(std::stod(exact_number(v)), v) << exact_number(v);
  }
  EXPECT_EQ(exact_number(13293576.0), "13293576");
  EXPECT_EQ(exact_number(0.1), "0.1");
}


// Two ranks, two profiled steps; step 3 has a nested all-reduce inside a
// forward, an evaluation after it, and a span on a second thread.
const char* kTrace = R"({"traceEvents":[
{"name":"process_name","ph":"M","pid":0,"tid":0,"args":{"name":"rank 0"}},
{"name":"process_name","ph":"M","pid":1,"tid":0,"args":{"name":"rank 1"}},
{"name":"step","cat":"step","ph":"X","pid":0,"tid":0,"ts":10.000,"dur":900.000,"args":{"step":3}},
{"name":"forward","cat":"compute","ph":"X","pid":0,"tid":0,"ts":20.000,"dur":300.000,"args":{"mb":0,"chunk":0,"action":"F0.0"}},
{"name":"all_reduce","cat":"comm","ph":"X","pid":0,"tid":0,"ts":100.500,"dur":50.250,"args":{"group":"tp","bytes":4096}},
{"name":"backward","cat":"compute","ph":"X","pid":0,"tid":0,"ts":400.000,"dur":400.000,"args":{"mb":0,"chunk":0}},
{"name":"evaluate","cat":"eval","ph":"X","pid":0,"tid":0,"ts":950.000,"dur":100.000,"args":{}},
{"name":"write","cat":"checkpoint","ph":"X","pid":0,"tid":1,"ts":960.000,"dur":10.000,"args":{}},
{"name":"step","cat":"step","ph":"X","pid":1,"tid":0,"ts":0.000,"dur":950.000,"args":{"step":3}},
{"name":"stage_recv","cat":"pipeline","ph":"X","pid":1,"tid":0,"ts":5.000,"dur":330.000,"args":{"direction":"forward","mb":0}},
{"name":"step","cat":"step","ph":"X","pid":0,"tid":0,"ts":2000.000,"dur":800.000,"args":{"step":4}},
{"name":"step","cat":"step","ph":"X","pid":1,"tid":0,"ts":2000.000,"dur":800.000,"args":{"step":4}},
{"name":"forward","cat":"compute","ph":"X","pid":1,"tid":0,"ts":2100.000,"dur":100.000,"args":{"mb":0}}
],"displayTimeUnit":"ms"})";

struct Rect {
  int rank, thread, depth;
  std::string name, cat;
  double start, dur;
};

std::vector<Rect> rects(const std::string& html) {
  static const std::regex rect(
      R"re(<rect class="span" [^>]*data-rank="(\d+)" data-thread="(\d+)" data-name="([^"]*)" data-cat="([^"]*)" data-start-us="([^"]*)" data-dur-us="([^"]*)" data-depth="(\d+)")re");
  std::vector<Rect> out;
  for (std::sregex_iterator it(html.begin(), html.end(), rect), end; it != end; ++it) {
    out.push_back({std::stoi((*it)[1]), std::stoi((*it)[2]), std::stoi((*it)[7]), (*it)[3], (*it)[4],
                   std::stod((*it)[5]), std::stod((*it)[6])});
  }
  return out;
}

TEST(HpReport, TimelineShowsTheFirstProfiledStepOnEveryRank) {
  std::istringstream in(kTrace);
  const auto t = parse_trace(in, "trace.json");
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->step, 3);
  EXPECT_EQ(t->profiled_steps, (std::vector<std::int64_t>{3, 4}));
  EXPECT_EQ(t->start_us, 0.0);
  // Step 3's spans and what ran after it (evaluation, a checkpoint write on
  // another thread) up to step 4's start; nothing of step 4.
  ASSERT_EQ(t->spans.size(), 8u);
  const std::string html = render_report({"r", parse(kRun), std::nullopt, t});
  EXPECT_NE(html.find("<h2 id=\"timeline\">Timeline of step 3</h2>"), std::string::npos);
  EXPECT_NE(html.find("href=\"#timeline\""), std::string::npos);
  const auto drawn = rects(html);
  ASSERT_EQ(drawn.size(), 8u);
  std::set<int> ranks;
  for (const Rect& r : drawn) {
    ranks.insert(r.rank);
    EXPECT_GE(r.dur, 0.0);
    EXPECT_LT(r.start, 2000.0) << r.name;
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1}));
  auto find = [&](const std::string& name, int rank) -> const Rect* {
    for (const Rect& r : drawn) {
      if (r.name == name && r.rank == rank) return &r;
    }
    return nullptr;
  };
  ASSERT_TRUE(find("all_reduce", 0));
  EXPECT_EQ(find("all_reduce", 0)->depth, 2);  // step > forward > all_reduce
  EXPECT_EQ(find("all_reduce", 0)->start, 100.5);
  EXPECT_EQ(find("all_reduce", 0)->dur, 50.25);
  EXPECT_EQ(find("forward", 0)->depth, 1);
  EXPECT_EQ(find("evaluate", 0)->depth, 0);
  ASSERT_TRUE(find("write", 0));
  EXPECT_EQ(find("write", 0)->thread, 1);
  EXPECT_EQ(find("write", 0)->depth, 0);
  EXPECT_EQ(find("stage_recv", 1)->cat, "pipeline");
  EXPECT_NE(html.find("data-arg-group=\"tp\""), std::string::npos);
  EXPECT_NE(html.find("data-arg-action=\"F0.0\""), std::string::npos);
  EXPECT_NE(html.find("data-arg-bytes=\"4096\""), std::string::npos);
  // Lane labels, one per rank and thread.
  EXPECT_NE(html.find(">rank 0 thread 1</text>"), std::string::npos);
  EXPECT_NE(html.find(">rank 1</text>"), std::string::npos);
}

TEST(HpReport, NoTimelineWithoutAProfiledStepOrTrace) {
  std::istringstream in(R"({"traceEvents":[{"name":"x","ph":"X","pid":0,"tid":0,"ts":1,"dur":1}]})");
  EXPECT_FALSE(parse_trace(in, "trace.json").has_value());
  const std::string html = render_report({"r", parse(kRun), std::nullopt});
  EXPECT_EQ(html.find("id=\"timeline\""), std::string::npos);
  EXPECT_EQ(html.find("class=\"span\""), std::string::npos);
}

TEST(HpReport, BadTraceIsNamed) {
  std::istringstream in("{\"traceEvents\": 3}");
  try {
    parse_trace(in, "runs/x/trace.json");
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("runs/x/trace.json is not a Chrome trace"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hp::report
