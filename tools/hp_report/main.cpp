// hp-report RUN_DIR: writes RUN_DIR/report.html, one page that needs no
// network: charts of metrics.jsonl as inline SVG, the timeline of one
// profiled step when RUN_DIR/trace.json exists, the last values and the
// resolved config.
// hp-report RUN_DIR RUN_DIR... | SWEEP_DIR: the comparison page of several
// runs (the config keys that differ, every run on shared charts, a summary
// against a baseline, seeds as mean and deviation), written to
// SWEEP_DIR/report.html, or --out FILE (default ./compare.html for run
// directories).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "framework/report/report.h"

namespace fs = std::filesystem;

namespace {

/// The runs of a sweep directory (hp-sweep's sweep.json), those with a
/// metrics file; the others are named in `skipped`.
std::vector<hp::report::RunData> sweep_runs(const std::string& dir, std::string* skipped) {
  std::ifstream in(fs::path(dir) / "sweep.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  std::vector<hp::report::RunData> runs;
  for (const auto& r : j.at("runs")) {
    const std::string run_dir = (fs::path(dir) / r.at("dir").get<std::string>()).string();
    if (!fs::exists(fs::path(run_dir) / "metrics.jsonl")) {
      *skipped += (skipped->empty() ? "" : ", ") + r.at("name").get<std::string>();
      continue;
    }
    runs.push_back(hp::report::load_run(run_dir, r.at("name").get<std::string>()));
  }
  return runs;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "hp-report: a self-contained page of a run's curves and config (RUN_DIR), or the comparison "
      "of "
      "several runs (RUN_DIR RUN_DIR..., or an hp-sweep SWEEP_DIR)"};
  std::vector<std::string> dirs;
  std::string output, baseline;
  app.add_option("run_dir", dirs, "Run directories (run.output_dir), or one hp-sweep directory")
      ->required();
  app.add_option("-o,--output,--out", output,
                 "Where to write the page (default RUN_DIR/report.html, SWEEP_DIR/report.html, or "
                 "./compare.html)");
  app.add_option("--baseline", baseline,
                 "The run the comparison's differences are taken from (default the first)");
  CLI11_PARSE(app, argc, argv);

  try {
    const bool sweep = dirs.size() == 1 && fs::exists(fs::path(dirs[0]) / "sweep.json");
    if (dirs.size() == 1 && !sweep) {
      std::string warning;
      const std::string written = hp::report::write_report_file(dirs[0], output, &warning);
      if (!warning.empty()) std::fprintf(stderr, "hp-report: %s\n", warning.c_str());
      std::printf("hp-report: wrote %s\n", written.c_str());
      return 0;
    }
    std::vector<hp::report::RunData> runs;
    std::string title, skipped;
    if (sweep) {
      runs = sweep_runs(dirs[0], &skipped);
      if (output.empty()) output = (fs::path(dirs[0]) / "report.html").string();
      title = "sweep " + dirs[0];
      if (!skipped.empty())
        std::fprintf(stderr, "hp-report: no metrics yet (refused or not run): %s\n",
                     skipped.c_str());
    } else {
      for (const auto& d : dirs)
        runs.push_back(hp::report::load_run(d, fs::path(d).lexically_normal().filename().string()));
      if (output.empty()) output = "compare.html";
      title = std::to_string(dirs.size()) + " run directories";
    }
    if (runs.empty()) throw std::runtime_error("no run with a metrics.jsonl to compare");
    const std::string page = hp::report::render_comparison(runs, baseline, title);
    std::ofstream out(output, std::ios::binary | std::ios::trunc);
    out << page;
    out.close();
    if (!out) throw std::runtime_error("cannot write " + output);
    std::printf("hp-report: wrote %s (%zu runs, %zu bytes)\n", output.c_str(), runs.size(),
                page.size());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hp-report: %s\n", e.what());
    return 2;
  }
  return 0;
}
