#pragma once
// run.profile: which steps the trainer records (include/hp/profile/trace.h)
// and where the trace goes. Each rank writes <run.output_dir>/trace/rank<RRRRR>.json
// after its last step; after the run's last barrier rank 0 merges them into
// <run.output_dir>/trace.json (one process track per rank). Across nodes
// the run directory must be on a shared file system, as for checkpoints.
#include <cstdint>
#include <set>
#include <string>

namespace hp {

class Config;

class RunProfiler {
 public:
  RunProfiler(const Config& c, int rank, std::string process_label);
  bool enabled() const { return enabled_; }
  /// Recording on for the steps run.profile.steps lists (`step` counted from
  /// 1); off for the others.
  void begin_step(std::int64_t step);
  /// Recording off (after the step's evaluation and checkpoint save).
  void end_step();
  /// This rank's events to <output_dir>/trace/rank<RRRRR>.json; returns its path.
  std::string write_rank_file();
  /// Rank 0, once every rank has written: the merged <output_dir>/trace.json.
  /// Returns its path; ranks whose file is missing are named in `missing`.
  std::string merge(int world_size, std::string* missing);

 private:
  bool enabled_ = false;
  std::set<std::int64_t> steps_;
  std::string dir_;
  int rank_;
  std::string label_;
};

}  // namespace hp
