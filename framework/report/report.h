#pragma once
// hp-report: one self-contained HTML page about a run, built from the run
// directory's metrics.jsonl and config.yaml. The charts are inline SVG
// written here (no script, no network); every plotted point is an SVG circle
// carrying its metrics.jsonl key, step and exact value as data attributes.
#include <cstdint>
#include <iosfwd>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace hp::report {

/// One line of metrics.jsonl: its step and every other numeric field
/// (`time` left out). JSON null (how the trainer writes NaN and infinities)
/// is an empty optional.
struct Row {
  std::int64_t step = 0;
  std::map<std::string, std::optional<double>> values;
  /// String fields (a generated sample's text, training.sample_interval).
  std::map<std::string, std::string> texts;
  /// The line's `time` (seconds since the Unix epoch), when it has one.
  std::optional<double> time;
};

/// Reads metrics.jsonl. Blank lines are skipped; so is a last line without
/// its newline that does not parse (the trainer may be writing it). Any
/// other line that is not a JSON object with an integer `step` throws
/// std::runtime_error naming `origin` and the line number. String fields
/// go to Row::texts; other non-numeric fields are ignored.
std::vector<Row> parse_metrics(std::istream& in, const std::string& origin);

/// One line of a chart: the metrics.jsonl key it plots, its legend label
/// and its points (step, value) in file order.
struct Series {
  std::string key;
  std::string label;
  std::vector<std::pair<std::int64_t, double>> points;
  /// The x of each point when the chart is not by step (tokens, seconds);
  /// empty: the step.
  std::vector<double> xs;
};

struct Chart {
  std::string id;     ///< HTML id, e.g. "chart-loss"
  std::string title;  ///< "Loss"
  std::string unit;   ///< y-axis unit: "", "bytes", "seconds", "tokens/s"
  std::vector<Series> series;
  std::string x_label = "step";
};

/// The charts for `rows`, in page order: loss and eval loss, tokens/s, MFU,
/// learning rate, gradient norm, step time, communication seconds and
/// bytes per group and operation, memory, pipeline idle and in-flight per
/// stage, MoE figures and per-expert load, then one chart per remaining
/// numeric key. A chart or series without any value is left out; null
/// values are not plotted.
std::vector<Chart> plan_charts(const std::vector<Row>& rows);

/// One span of a profiled run's trace.json (a Chrome "X" event).
struct TraceSpan {
  int rank = 0;     ///< the event's pid: the trainer writes one process per rank
  int thread = 0;   ///< its tid
  int depth = 0;    ///< nesting level within its rank and thread (0 = outermost)
  std::string name, category;
  double start_us = 0, duration_us = 0;
  std::map<std::string, std::string> args;  ///< numbers as the shortest exact decimal
};

/// The spans of one profiled step on every rank: from the earliest start of
/// that step's "step" spans to the earliest start of a later step's (or the
/// last span's end), so the evaluation and checkpoint save after the step
/// are in it.
struct Timeline {
  std::int64_t step = 0;
  double start_us = 0, end_us = 0;
  std::vector<TraceSpan> spans;  ///< by rank, thread, start (parents before children)
  std::vector<std::int64_t> profiled_steps;  ///< every step the trace holds
};

/// The first profiled step of a trace.json written by hp-train
/// (run.profile.enabled), or nullopt when it holds no step span. Throws
/// std::runtime_error naming `origin` when the file is not a trace.
std::optional<Timeline> parse_trace(std::istream& in, const std::string& origin);

/// The timeline as an inline <svg>: one lane per rank (and thread), time
/// across; each span a <rect class="span"> carrying data-rank, data-thread,
/// data-name, data-cat, data-start-us, data-dur-us, data-depth and its args
/// as data-arg-<key>.
std::string render_timeline_svg(const Timeline& timeline);

/// Everything the page shows.
struct ReportInput {
  std::string run_dir;
  std::vector<Row> rows;
  std::optional<std::string> config_yaml;  ///< config.yaml as written by the trainer
  std::optional<Timeline> timeline;        ///< from trace.json when the run was profiled
};

/// The whole page.
std::string render_report(const ReportInput& input);

/// Reads RUN_DIR's metrics.jsonl, config.yaml and trace.json (when there)
/// and writes the page to `output` ("" = RUN_DIR/report.html). Returns
/// "<path> (<N> logged steps, <B> bytes)"; throws std::runtime_error with a
/// one-line reason when metrics.jsonl is missing or malformed or the page
/// cannot be written. A trace that does not parse only sets `warning`.
std::string write_report_file(const std::string& run_dir, std::string output, std::string* warning);

/// One run of a comparison: its name on the page, its directory, its
/// metrics and its config.yaml flattened to "a.b.c" -> value (YAML text).
struct RunData {
  std::string name, dir;
  std::vector<Row> rows;
  std::map<std::string, std::string> config;
  /// hp-plan --measure's prediction for this run (predicted.json): its
  /// layout, step seconds and memory per rank above the baseline (MiB,
  /// the largest rank); empty label when the run was not planned.
  std::string planned_layout;
  double predicted_step_seconds = NAN, predicted_memory_mib = NAN;
  /// Each rank's peak resident memory after its last step minus its own at
  /// start (peaks.json, MiB); empty when the run wrote none.
  std::vector<double> rank_memory_mib;
};

/// A planned run's prediction beside its measurement: the median step
/// after the first two, and the largest rank's peak above its start.
struct PlanCheck {
  double predicted_step = NAN, measured_step = NAN, predicted_mib = NAN, measured_mib = NAN;
  double step_error_percent() const { return 100 * (predicted_step - measured_step) / measured_step; }
  double memory_error_percent() const { return 100 * (predicted_mib - measured_mib) / measured_mib; }
};
PlanCheck plan_check(const RunData& run);

/// A run's figures: the last logged loss and eval loss; tokens/s, MFU and
/// communication bytes per step as medians over the logged steps after the
/// first; the logging rank's peak resident memory (MiB). NaN: not logged.
struct RunSummary {
  double loss = NAN, eval_loss = NAN, tokens_per_second = NAN, peak_mib = NAN, mfu = NAN, comm_bytes = NAN;
};
RunSummary summarize(const RunData& run);

/// Reads a run directory (metrics.jsonl, config.yaml); throws
/// std::runtime_error with a one-line reason when metrics.jsonl is missing.
RunData load_run(const std::string& dir, const std::string& name);

/// Leaves of a YAML document as "a.b.c" -> its value (sequences and flow
/// maps as their YAML text).
std::map<std::string, std::string> flatten_yaml(const std::string& text);

/// The comparison page of several runs: the config keys that differ
/// (run.output_dir and paths inside a run's own directory left out), every
/// run on shared charts (loss and eval loss by step, by tokens and by wall
/// time; tokens/s; peak memory; communication bytes), a summary table with
/// each figure's difference from the baseline run (`baseline`: a run name;
/// "" the first), and, for runs that differ only in run.seed, mean ±
/// standard deviation per variant with differences within twice the larger
/// standard deviation marked as seed noise. `title` heads the page.
std::string render_comparison(const std::vector<RunData>& runs, const std::string& baseline, const std::string& title);

/// The pages' shared stylesheet, and a chart's legend (one swatch per
/// series, in the chart's colours).
const char* page_style();
std::string chart_legend(const Chart& chart);

/// One chart as an inline <svg> element.
std::string render_chart_svg(const Chart& chart);

/// `text` safe inside HTML text and double- or single-quoted attributes.
std::string html_escape(const std::string& text);

/// The shortest decimal that reads back as exactly `value` ("0.1", "5e-05",
/// "13293576").
std::string exact_number(double value);

}  // namespace hp::report
