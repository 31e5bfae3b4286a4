#include "framework/trainer/run_report.h"

#include "hp/logging/logging.h"
#include "framework/report/report.h"

namespace hp {

void write_run_report(const std::string& run_dir) {
  auto log = log::logger();
  try {
    std::string warning;
    const std::string written = report::write_report_file(run_dir, "", &warning);
    if (!warning.empty()) log->warn("run.report: {}", warning);
    log->info("run.report: report written to {}", written);
  } catch (const std::exception& e) {
    log->error("run.report: the report page was not written: {}", e.what());
  }
}

}  // namespace hp
