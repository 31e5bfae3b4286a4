#pragma once
// run.report: the page of a finished run (RUN_DIR/report.html, what
// hp-report writes), written by Trainer::fit on rank 0, so hp-train and a
// C++ application calling fit() both get it.
#include <string>

namespace hp {

/// Writes <run_dir>/report.html and logs where; a failure to write it is
/// logged, not thrown (the training itself succeeded).
void write_run_report(const std::string& run_dir);

}  // namespace hp
