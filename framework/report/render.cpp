// The page: inline SVG charts, the last logged values and the config.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "framework/report/report.h"

namespace hp::report {
namespace {

constexpr double kWidth = 520, kHeight = 260;
constexpr double kLeft = 72, kRight = 16, kTop = 12, kBottom = 36;

// Colour-blind friendly (Okabe-Ito, then a few more).
constexpr const char* kColours[] = {"#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00",
                                    "#56b4e9", "#000000", "#f0e442", "#7f3c8d", "#11a579"};

std::string fixed2(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.2f", v);
  return buffer;
}

// Axis labels: three significant digits with an SI prefix (12.3M, 450k, 6e-05).
std::string short_number(double v) {
  const double a = std::fabs(v);
  const char* suffix = "";
  double shown = v;
  if (a >= 1e12) {
    shown = v / 1e12, suffix = "T";
  } else if (a >= 1e9) {
    shown = v / 1e9, suffix = "G";
  } else if (a >= 1e6) {
    shown = v / 1e6, suffix = "M";
  } else if (a >= 1e3) {
    shown = v / 1e3, suffix = "k";
  }
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.3g%s", shown, suffix);
  return buffer;
}

struct Range {
  double lo, hi;
};

// About five round ticks covering [lo, hi]; the range grows to the outer ticks.
std::vector<double> nice_ticks(Range& r, bool integers) {
  if (!(r.hi > r.lo)) {
    const double pad = r.lo == 0 ? 1 : std::fabs(r.lo) * 0.1;
    r = {r.lo - pad, r.hi + pad};
  }
  const double raw = (r.hi - r.lo) / 5;
  const double magnitude = std::pow(10, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * magnitude;
    if (step >= raw) break;
  }
  if (integers) step = std::max(1.0, std::round(step));
  r.lo = std::floor(r.lo / step) * step;
  r.hi = std::ceil(r.hi / step) * step;
  std::vector<double> ticks;
  for (int i = 0; i <= 12; ++i) {
    const double t = r.lo + i * step;
    if (t > r.hi + step * 1e-9) break;
    ticks.push_back(std::fabs(t) < step * 1e-9 ? 0.0 : t);
  }
  return ticks;
}

std::string legend(const Chart& chart) {
  std::string out = "<ul class=\"legend\">";
  for (std::size_t i = 0; i < chart.series.size(); ++i) {
    out += "<li><span class=\"swatch\" style=\"background:";
    out += kColours[i % std::size(kColours)];
    out += "\"></span>" + html_escape(chart.series[i].label) + "</li>";
  }
  return out + "</ul>";
}

const char* kStyle = R"(
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#1b1b1b;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px}
.meta{color:#555;margin:0 0 12px}
nav a{margin-right:12px;white-space:nowrap}
.charts{display:flex;flex-wrap:wrap;gap:16px}
figure{margin:0;border:1px solid #ddd;border-radius:6px;padding:8px 8px 4px;background:#fcfcfc}
figcaption{font-weight:600}
.legend{list-style:none;margin:4px 0;padding:0;display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;max-width:520px}
.swatch{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
svg text{font:11px system-ui,sans-serif;fill:#444}
svg .grid{stroke:#e4e4e4}svg .axis{stroke:#888}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:2px 8px;text-align:left}
td.num{text-align:right;font-family:ui-monospace,monospace}
figure.wide{overflow-x:auto;max-width:100%}svg rect.span{stroke:#fff;stroke-width:0.5}
pre{background:#f6f6f6;border:1px solid #ddd;padding:12px;overflow:auto;max-height:600px}
)";

}  // namespace

const char* page_style() { return kStyle; }
std::string chart_legend(const Chart& chart) { return legend(chart); }

std::string html_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string exact_number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

std::string render_chart_svg(const Chart& chart) {
  Range x{std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()};
  Range y = x;
  auto x_of = [](const Series& s, std::size_t p) {
    return s.xs.empty() ? static_cast<double>(s.points[p].first) : s.xs[p];
  };
  for (const Series& s : chart.series) {
    for (std::size_t p = 0; p < s.points.size(); ++p) {
      const double value = s.points[p].second;
      x.lo = std::min(x.lo, x_of(s, p));
      x.hi = std::max(x.hi, x_of(s, p));
      if (std::isfinite(value)) {
        y.lo = std::min(y.lo, value);
        y.hi = std::max(y.hi, value);
      }
    }
  }
  if (!std::isfinite(x.lo)) x = {0, 1};
  if (!std::isfinite(y.lo)) y = {0, 1};
  const std::vector<double> x_ticks = nice_ticks(x, chart.x_label == "step");
  const std::vector<double> y_ticks = nice_ticks(y, false);
  const double pw = kWidth - kLeft - kRight, ph = kHeight - kTop - kBottom;
  auto px = [&](double v) { return kLeft + (v - x.lo) / (x.hi - x.lo) * pw; };
  auto py = [&](double v) {
    // Infinities are pinned to the frame rather than lost.
    const double c = std::min(std::max(v, y.lo), y.hi);
    return kTop + (1 - (c - y.lo) / (y.hi - y.lo)) * ph;
  };

  std::ostringstream out;
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
      << "\" viewBox=\"0 0 " << kWidth << ' ' << kHeight << "\" role=\"img\" aria-label=\""
      << html_escape(chart.title) << "\">";
  for (double t : y_ticks) {
    const std::string yy = fixed2(py(t));
    out << "<line class=\"grid\" x1=\"" << kLeft << "\" x2=\"" << kWidth - kRight << "\" y1=\"" << yy
        << "\" y2=\"" << yy << "\"/><text x=\"" << kLeft - 6 << "\" y=\"" << yy
        << "\" dy=\"4\" text-anchor=\"end\">" << html_escape(short_number(t)) << "</text>";
  }
  for (double t : x_ticks) {
    const std::string xx = fixed2(px(t));
    out << "<line class=\"grid\" x1=\"" << xx << "\" x2=\"" << xx << "\" y1=\"" << kTop << "\" y2=\""
        << kTop + ph << "\"/><text x=\"" << xx << "\" y=\"" << kTop + ph + 16
        << "\" text-anchor=\"middle\">" << html_escape(short_number(t)) << "</text>";
  }
  out << "<rect class=\"axis\" fill=\"none\" x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << pw
      << "\" height=\"" << ph << "\"/>";
  out << "<text x=\"" << kLeft + pw / 2 << "\" y=\"" << kHeight - 4 << "\" text-anchor=\"middle\">" << html_escape(chart.x_label) << "</text>";
  if (!chart.unit.empty()) {
    out << "<text transform=\"rotate(-90)\" x=\"" << -(kTop + ph / 2) << "\" y=\"12\" text-anchor=\"middle\">"
        << html_escape(chart.unit) << "</text>";
  }
  for (std::size_t i = 0; i < chart.series.size(); ++i) {
    const Series& s = chart.series[i];
    const char* colour = kColours[i % std::size(kColours)];
    const std::string key = html_escape(s.key);
    if (s.points.size() > 1) {
      out << "<polyline fill=\"none\" stroke=\"" << colour << "\" stroke-width=\"1.5\" points=\"";
      for (std::size_t p = 0; p < s.points.size(); ++p) {
        out << (p ? " " : "") << fixed2(px(x_of(s, p))) << ',' << fixed2(py(s.points[p].second));
      }
      out << "\"/>";
    }
    for (std::size_t p = 0; p < s.points.size(); ++p) {
      const auto& [step, value] = s.points[p];
      const std::string v = exact_number(value);
      out << "<circle class=\"point\" cx=\"" << fixed2(px(x_of(s, p))) << "\" cy=\""
          << fixed2(py(value)) << "\" r=\"2.5\" fill=\"" << colour << "\" data-key=\"" << key
          << "\" data-step=\"" << step << "\" data-value=\"" << v << "\"><title>" << html_escape(s.label)
          << " at step " << step << ": " << v << "</title></circle>";
    }
  }
  out << "</svg>";
  return out.str();
}

std::string render_report(const ReportInput& input) {
  const std::vector<Chart> charts = plan_charts(input.rows);
  std::ostringstream out;
  out << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
      << "<meta name=\"generator\" content=\"hp-report\">"
      << "<link rel=\"icon\" href=\"data:,\">"
      << "<title>hp-report: " << html_escape(input.run_dir) << "</title><style>" << kStyle
      << "</style></head><body>\n";
  out << "<h1>Run report</h1><p class=\"meta\">run directory <code>" << html_escape(input.run_dir) << "</code>; ";
  if (input.rows.empty()) {
    out << "metrics.jsonl has no logged step yet.</p>\n";
  } else {
    out << input.rows.size() << " logged steps, from step " << input.rows.front().step << " to step "
        << input.rows.back().step << ".</p>\n";
  }
  if (!charts.empty()) {
    out << "<nav>";
    for (const Chart& c : charts) out << "<a href=\"#" << html_escape(c.id) << "\">" << html_escape(c.title) << "</a> ";
    if (input.timeline) out << "<a href=\"#timeline\">Timeline</a> ";
    if (std::any_of(input.rows.begin(), input.rows.end(), [](const Row& r) { return !r.texts.empty(); }))
      out << "<a href=\"#samples\">Samples</a> ";
    out << "<a href=\"#last-values\">Last values</a> <a href=\"#config\">Configuration</a></nav>\n";
  }
  out << "<h2>Charts</h2><div class=\"charts\">\n";
  for (const Chart& c : charts) {
    out << "<figure id=\"" << html_escape(c.id) << "\"><figcaption>" << html_escape(c.title) << "</figcaption>"
        << legend(c) << render_chart_svg(c) << "</figure>\n";
  }
  out << "</div>\n";

  if (input.timeline) {
    const Timeline& t = *input.timeline;
    out << "<h2 id=\"timeline\">Timeline of step " << t.step << "</h2><p class=\"meta\">From trace.json (profiled "
        << "steps";
    for (std::size_t i = 0; i < t.profiled_steps.size(); ++i) out << (i ? ", " : " ") << t.profiled_steps[i];
    out << "; open it in Perfetto for all of them): " << t.spans.size()
        << " spans, one lane per rank, nested spans below their parent. Hovering a span shows its name, "
        << "arguments and duration.</p>";
    out << "<ul class=\"legend\">";
    const std::pair<const char*, const char*> kinds[] = {
        {"#0072b2", "forward"},        {"#d55e00", "backward"},          {"#999999", "stage-message wait"},
        {"#009e73", "communication"}, {"#cc79a7", "optimizer"},         {"#e69f00", "checkpoint"},
        {"#56b4e9", "evaluation"},    {"#e8e8e8", "step"}};
    for (const auto& [colour, what] : kinds) {
      out << "<li><span class=\"swatch\" style=\"background:" << colour << "\"></span>" << what << "</li>";
    }
    out << "</ul><figure class=\"wide\">" << render_timeline_svg(t) << "</figure>\n";
  }

  std::vector<const Row*> sampled;
  for (const Row& row : input.rows) {
    if (!row.texts.empty()) sampled.push_back(&row);
  }
  if (!sampled.empty()) {
    out << "<h2 id=\"samples\">Samples</h2><p class=\"meta\">Text the model generated during training "
        << "(training.sample_interval), greedily from training.sample_prompt.</p><table><tr><th>step</th><th>key</th>"
        << "<th>text</th></tr>";
    for (const Row* row : sampled) {
      for (const auto& [key, text] : row->texts) {
        out << "<tr><td class=\"num\">" << row->step << "</td><td>" << html_escape(key)
            << "</td><td><pre class=\"sample\">" << html_escape(text) << "</pre></td></tr>";
      }
    }
    out << "</table>\n";
  }
  out << "<h2 id=\"last-values\">Last logged values</h2>";
  if (input.rows.empty()) {
    out << "<p>None.</p>\n";
  } else {
    std::map<std::string, std::pair<std::int64_t, std::optional<double>>> last;
    for (const Row& row : input.rows) {
      for (const auto& [key, value] : row.values) last[key] = {row.step, value};
    }
    out << "<table><tr><th>key</th><th>step</th><th>value</th></tr>";
    for (const auto& [key, entry] : last) {
      out << "<tr><td>" << html_escape(key) << "</td><td class=\"num\">" << entry.first << "</td><td class=\"num\">"
          << (entry.second ? exact_number(*entry.second) : "null") << "</td></tr>";
    }
    out << "</table>\n";
  }

  out << "<h2 id=\"config\">Resolved configuration</h2>";
  if (input.config_yaml) {
    out << "<pre>" << html_escape(*input.config_yaml) << "</pre>\n";
  } else {
    out << "<p>No config.yaml in the run directory.</p>\n";
  }
  out << "</body></html>\n";
  return out.str();
}

}  // namespace hp::report
