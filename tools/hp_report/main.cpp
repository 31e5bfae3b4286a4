// hp-report RUN_DIR: writes RUN_DIR/report.html, one page that needs no
// network: charts of metrics.jsonl as inline SVG, the timeline of one
// profiled step when RUN_DIR/trace.json exists, the last values and the
// resolved config.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "tools/hp_report/report.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  CLI::App app{"hp-report: write RUN_DIR/report.html, a self-contained page of a run's curves and config"};
  std::string run_dir, output;
  app.add_option("run_dir", run_dir, "Run directory (run.output_dir): reads metrics.jsonl, config.yaml and trace.json")
      ->required();
  app.add_option("-o,--output", output, "Where to write the page (default RUN_DIR/report.html)");
  CLI11_PARSE(app, argc, argv);

  const fs::path metrics = fs::path(run_dir) / "metrics.jsonl";
  std::ifstream in(metrics);
  if (!in) {
    std::fprintf(stderr,
                 "hp-report: cannot read %s: is %s the run.output_dir of an hp-train run with "
                 "metrics.jsonl on (the default)?\n",
                 metrics.c_str(), run_dir.c_str());
    return 2;
  }
  hp::report::ReportInput input;
  input.run_dir = run_dir;
  try {
    input.rows = hp::report::parse_metrics(in, metrics.string());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hp-report: %s\n", e.what());
    return 2;
  }
  std::ifstream config(fs::path(run_dir) / "config.yaml");
  if (config) {
    std::ostringstream text;
    text << config.rdbuf();
    input.config_yaml = text.str();
  }
  std::ifstream trace(fs::path(run_dir) / "trace.json");
  if (trace) {
    try {
      input.timeline = hp::report::parse_trace(trace, (fs::path(run_dir) / "trace.json").string());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "hp-report: %s; the page is written without a timeline\n", e.what());
    }
  }
  if (output.empty()) output = (fs::path(run_dir) / "report.html").string();
  const std::string page = hp::report::render_report(input);
  std::ofstream out(output, std::ios::binary | std::ios::trunc);
  out << page;
  out.close();
  if (!out) {
    std::fprintf(stderr, "hp-report: cannot write %s\n", output.c_str());
    return 1;
  }
  std::printf("hp-report: wrote %s (%zu logged steps, %zu bytes)\n", output.c_str(), input.rows.size(),
              page.size());
  return 0;
}
