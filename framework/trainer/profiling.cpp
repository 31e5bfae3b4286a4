#include "framework/trainer/profiling.h"

#include <cstdio>

#include "backends/comm/rank_files.h"
#include "hp/profile/trace.h"
#include "hp/config/config.h"

namespace hp {

namespace {
std::string rank_file(const std::string& dir, int rank) {
  return dir + "/trace/" + dist::rank_file_name("", rank, ".json");
}
}  // namespace

RunProfiler::RunProfiler(const Config& c, int rank, std::string process_label)
    : enabled_(c.get_bool("run.profile.enabled")),
      dir_(c.get_string("run.output_dir")),
      rank_(rank),
      label_(std::move(process_label)) {
  for (auto s : c.get_int_list("run.profile.steps")) steps_.insert(s);
  profile::set_recording(false);
  profile::take_events();  // a previous fit in this process left nothing behind
}

void RunProfiler::begin_step(std::int64_t step) {
  if (enabled_) profile::set_recording(steps_.count(step) != 0);
}

void RunProfiler::end_step() {
  if (enabled_) profile::set_recording(false);
}

std::string RunProfiler::write_rank_file() {
  profile::set_recording(false);
  const std::string path = rank_file(dir_, rank_);
  profile::write_rank_trace(path, rank_, label_, profile::take_events());
  return path;
}

std::string RunProfiler::merge(int world_size, std::string* missing) {
  std::vector<std::string> inputs;
  for (int r = 0; r < world_size; ++r) inputs.push_back(rank_file(dir_, r));
  const std::string out = dir_ + "/trace.json";
  const auto gone = profile::merge_traces(inputs, out);
  if (missing) {
    missing->clear();
    for (const auto& g : gone) *missing += (missing->empty() ? "" : ", ") + g;
  }
  return out;
}

}  // namespace hp
