// The timeline of one profiled step: reading trace.json and drawing it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <istream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "framework/report/report.h"

namespace hp::report {
namespace {

constexpr double kWidth = 1080, kLabel = 120, kRight = 16, kRow = 16, kLaneGap = 8, kAxis = 28;

std::string fixed2(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.2f", v);
  return buffer;
}

std::string arg_text(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number()) return exact_number(v.get<double>());
  return v.dump();
}

// What each kind of span is drawn in (Okabe-Ito, as the charts).
const char* colour_of(const TraceSpan& s) {
  if (s.name == "forward") return s.category == "eval" ? "#56b4e9" : "#0072b2";
  if (s.name == "backward") return "#d55e00";
  if (s.category == "pipeline") return "#999999";
  if (s.category == "comm") return "#009e73";
  if (s.category == "optimizer") return "#cc79a7";
  if (s.category == "checkpoint") return "#e69f00";
  if (s.category == "eval") return "#56b4e9";
  if (s.category == "step") return "#e8e8e8";
  return "#7f3c8d";
}

// Keys safe in an attribute name: letters, digits, '-' and '_'.
std::string attribute_key(const std::string& key) {
  std::string out;
  for (char c : key) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
    out += ok ? c : (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : '_';
  }
  return out;
}

}  // namespace

std::optional<Timeline> parse_trace(std::istream& in, const std::string& origin) {
  nlohmann::json trace;
  try {
    in >> trace;
    if (!trace.at("traceEvents").is_array())
      throw std::runtime_error("traceEvents is not an array");
  } catch (const std::exception& e) {
    throw std::runtime_error(origin + " is not a Chrome trace written by hp-train (" +
                             std::string(e.what()).substr(0, 160) + ")");
  }
  std::vector<TraceSpan> all;
  for (const auto& e : trace["traceEvents"]) {
    if (!e.is_object() || e.value("ph", "") != "X") continue;
    TraceSpan s;
    try {
      s.rank = e.at("pid").get<int>();
      s.thread = e.value("tid", 0);
      s.name = e.at("name").get<std::string>();
      s.category = e.value("cat", "");
      s.start_us = e.at("ts").get<double>();
      s.duration_us = e.value("dur", 0.0);
    } catch (const std::exception& err) {
      throw std::runtime_error(origin + ": a span without pid, name or ts (" +
                               e.dump().substr(0, 120) + ")");
    }
    if (e.contains("args") && e["args"].is_object()) {
      for (const auto& [k, v] : e["args"].items()) s.args[k] = arg_text(v);
    }
    all.push_back(std::move(s));
  }
  // The steps the trace holds, and where each starts (earliest rank).
  std::map<std::int64_t, double> step_start;
  for (const TraceSpan& s : all) {
    if (s.name != "step" || s.category != "step" || !s.args.count("step")) continue;
    const auto step = static_cast<std::int64_t>(std::stod(s.args.at("step")));
    auto it = step_start.find(step);
    if (it == step_start.end() || s.start_us < it->second) step_start[step] = s.start_us;
  }
  if (step_start.empty()) return std::nullopt;
  Timeline t;
  for (const auto& kv : step_start) t.profiled_steps.push_back(kv.first);
  t.step = step_start.begin()->first;
  t.start_us = step_start.begin()->second;
  const bool has_next = step_start.size() > 1;
  const double next =
      has_next ? std::next(step_start.begin())->second : std::numeric_limits<double>::infinity();
  t.end_us = t.start_us;
  for (TraceSpan& s : all) {
    if (s.start_us < t.start_us || s.start_us >= next) continue;
    t.end_us = std::max(t.end_us, s.start_us + s.duration_us);
    t.spans.push_back(std::move(s));
  }
  if (has_next) t.end_us = std::min(t.end_us, next);
  std::stable_sort(t.spans.begin(), t.spans.end(), [](const TraceSpan& a, const TraceSpan& b) {
    if (a.rank != b.rank) return a.rank < b.rank;
    if (a.thread != b.thread) return a.thread < b.thread;
    if (a.start_us != b.start_us) return a.start_us < b.start_us;
    return a.duration_us > b.duration_us;
  });
  // Depth within each (rank, thread): how many enclosing spans are still open.
  std::vector<double> open_ends;
  std::pair<int, int> lane{-1, -1};
  for (TraceSpan& s : t.spans) {
    if (std::make_pair(s.rank, s.thread) != lane) {
      lane = {s.rank, s.thread};
      open_ends.clear();
    }
    while (!open_ends.empty() && open_ends.back() <= s.start_us) open_ends.pop_back();
    s.depth = static_cast<int>(open_ends.size());
    open_ends.push_back(s.start_us + s.duration_us);
  }
  return t;
}

std::string render_timeline_svg(const Timeline& t) {
  // Lanes: one per (rank, thread), as tall as its deepest nesting.
  std::map<std::pair<int, int>, int> depth;
  for (const TraceSpan& s : t.spans) {
    int& d = depth[{s.rank, s.thread}];
    d = std::max(d, s.depth + 1);
  }
  std::map<std::pair<int, int>, double> lane_top;
  double y = 4;
  for (const auto& [lane, d] : depth) {
    lane_top[lane] = y;
    y += d * kRow + kLaneGap;
  }
  const double height = y + kAxis;
  const double span_us = std::max(t.end_us - t.start_us, 1.0);
  const double plot = kWidth - kLabel - kRight;
  auto px = [&](double us) { return kLabel + (us - t.start_us) / span_us * plot; };

  std::ostringstream out;
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"timeline\" width=\"" << kWidth
      << "\" height=\"" << fixed2(height) << "\" viewBox=\"0 0 " << kWidth << ' ' << fixed2(height)
      << "\" role=\"img\" aria-label=\"timeline of step " << t.step << "\" data-step=\"" << t.step
      << "\">";
  // Time axis in milliseconds from the step's start, about eight ticks.
  const double ms = span_us / 1000.0;
  const double raw = ms / 8;
  const double magnitude = std::pow(10, std::floor(std::log10(raw)));
  double tick = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    tick = m * magnitude;
    if (tick >= raw) break;
  }
  for (double v = 0; v <= ms + tick * 1e-9; v += tick) {
    const std::string xx = fixed2(px(t.start_us + v * 1000));
    out << "<line class=\"grid\" x1=\"" << xx << "\" x2=\"" << xx << "\" y1=\"0\" y2=\""
        << fixed2(y) << "\"/>"
        << "<text x=\"" << xx << "\" y=\"" << fixed2(y + 14) << "\" text-anchor=\"middle\">"
        << html_escape(exact_number(std::round(v * 1000) / 1000)) << "</text>";
  }
  out << "<text x=\"" << kLabel + plot / 2 << "\" y=\"" << fixed2(height - 2)
      << "\" text-anchor=\"middle\">ms since the step began</text>";
  for (const auto& [lane, top] : lane_top) {
    const std::string label = "rank " + std::to_string(lane.first) +
                              (lane.second ? " thread " + std::to_string(lane.second) : "");
    out << "<text class=\"lane\" x=\"4\" y=\"" << fixed2(top + 12) << "\" data-rank=\""
        << lane.first << "\" data-thread=\"" << lane.second << "\">" << html_escape(label)
        << "</text>";
  }
  for (const TraceSpan& s : t.spans) {
    const double x = px(s.start_us);
    const double w = std::max(px(s.start_us + s.duration_us) - x, 0.5);
    const double top = lane_top[{s.rank, s.thread}] + s.depth * kRow;
    out << "<rect class=\"span\" x=\"" << fixed2(x) << "\" y=\"" << fixed2(top) << "\" width=\""
        << fixed2(w) << "\" height=\"" << kRow - 2 << "\" fill=\"" << colour_of(s)
        << "\" data-rank=\"" << s.rank << "\" data-thread=\"" << s.thread << "\" data-name=\""
        << html_escape(s.name) << "\" data-cat=\"" << html_escape(s.category)
        << "\" data-start-us=\"" << exact_number(s.start_us) << "\" data-dur-us=\""
        << exact_number(s.duration_us) << "\" data-depth=\"" << s.depth << "\"";
    for (const auto& [k, v] : s.args)
      out << " data-arg-" << attribute_key(k) << "=\"" << html_escape(v) << "\"";
    out << "><title>" << html_escape(s.name);
    for (const auto& [k, v] : s.args) out << ' ' << html_escape(k) << '=' << html_escape(v);
    char dur[48];
    std::snprintf(dur, sizeof dur, ": %.3f ms", s.duration_us / 1000.0);
    out << dur << "</title></rect>";
  }
  out << "</svg>";
  return out.str();
}

}  // namespace hp::report
