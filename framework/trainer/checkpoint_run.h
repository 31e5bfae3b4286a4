#pragma once
// What the tools that run a checkpoint's model (hp-eval, hp-generate) share:
// finding the step, and the overrides that keep such a run from training,
// saving or writing into the training run's directory.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpoint/reader.h"

namespace hp {

/// A step directory (holding manifest.json), or a checkpoint root's latest
/// committed step. Throws std::invalid_argument naming the path otherwise.
inline std::string checkpoint_step_dir(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::path(path) / "manifest.json", ec)) return path;
  const std::string latest = hp::ckpt::CheckpointReader::latest(path);
  if (latest.empty())
    throw std::invalid_argument(path + " is neither a checkpoint step directory (no manifest.json) nor a root with "
                                "a committed step (no latest)");
  return latest;
}

/// The config a checkpoint run starts from: `config_file` when given (an
/// imported checkpoint stores none: hp-ckpt import's model.yaml beside a
/// data section), else the one stored in `step`. Throws
/// std::invalid_argument when there is none or the file cannot be read.
inline std::string checkpoint_config_text(const std::string& step, const std::string& config_file) {
  std::string yaml = hp::ckpt::CheckpointReader(step).config_text();
  if (!config_file.empty()) {
    std::ifstream in(config_file);
    if (!in) throw std::invalid_argument("--config " + config_file + ": cannot be read");
    yaml.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (yaml.empty()) throw std::invalid_argument(step + " stores no config (an imported checkpoint): give --config FILE");
  return yaml;
}

/// Appended after the user's overrides: resume from `step`, write into
/// `out` only, no checkpoints, metrics files, pages, traces or dumps.
inline std::vector<std::string> checkpoint_run_overrides(const std::string& step, const std::string& out) {
  return {"checkpoint.interval=0",
          "metrics.jsonl=false",
          "metrics.prometheus.enabled=false",
          "run.report=false",
          "run.profile.enabled=false",
          "training.dump_grads_at_step=0",
          "training.dump_activations_steps=[]",
          "training.dump_routing_steps=[]",
          "checkpoint.resume=" + std::filesystem::absolute(step).string(),
          "run.output_dir=" + out};
}

}  // namespace hp
