#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "framework/report/report.h"

namespace hp::report {

namespace fs = std::filesystem;

std::string write_report_file(const std::string& run_dir, std::string output, std::string* warning) {
  const fs::path metrics = fs::path(run_dir) / "metrics.jsonl";
  std::ifstream in(metrics);
  if (!in) {
    throw std::runtime_error("cannot read " + metrics.string() + ": is " + run_dir +
                             " the run.output_dir of an hp-train run with metrics.jsonl on (the default)?");
  }
  ReportInput input;
  input.run_dir = run_dir;
  input.rows = parse_metrics(in, metrics.string());
  std::ifstream config(fs::path(run_dir) / "config.yaml");
  if (config) {
    std::ostringstream text;
    text << config.rdbuf();
    input.config_yaml = text.str();
  }
  std::ifstream trace(fs::path(run_dir) / "trace.json");
  if (trace) {
    try {
      input.timeline = parse_trace(trace, (fs::path(run_dir) / "trace.json").string());
    } catch (const std::exception& e) {
      if (warning != nullptr) *warning = std::string(e.what()) + "; the page is written without a timeline";
    }
  }
  if (output.empty()) output = (fs::path(run_dir) / "report.html").string();
  const std::string page = render_report(input);
  std::ofstream out(output, std::ios::binary | std::ios::trunc);
  out << page;
  out.close();
  if (!out) throw std::runtime_error("cannot write " + output);
  return output + " (" + std::to_string(input.rows.size()) + " logged steps, " + std::to_string(page.size()) +
         " bytes)";
}

}  // namespace hp::report
