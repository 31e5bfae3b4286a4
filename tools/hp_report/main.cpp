// hp-report RUN_DIR: writes RUN_DIR/report.html, one page that needs no
// network: charts of metrics.jsonl as inline SVG, the timeline of one
// profiled step when RUN_DIR/trace.json exists, the last values and the
// resolved config.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <stdexcept>
#include <string>

#include "framework/report/report.h"

int main(int argc, char** argv) {
  CLI::App app{"hp-report: write RUN_DIR/report.html, a self-contained page of a run's curves and config"};
  std::string run_dir, output;
  app.add_option("run_dir", run_dir, "Run directory (run.output_dir): reads metrics.jsonl, config.yaml and trace.json")
      ->required();
  app.add_option("-o,--output", output, "Where to write the page (default RUN_DIR/report.html)");
  CLI11_PARSE(app, argc, argv);

  std::string warning, written;
  try {
    written = hp::report::write_report_file(run_dir, output, &warning);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hp-report: %s\n", e.what());
    return 2;
  }
  if (!warning.empty()) std::fprintf(stderr, "hp-report: %s\n", warning.c_str());
  std::printf("hp-report: wrote %s\n", written.c_str());
  return 0;
}
