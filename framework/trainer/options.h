#pragma once
// The config sections the trainer reads, each into a typed struct once
// (as OptimizerOptions::from does), not by string lookups through the code.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace hp {

class Config;
namespace dist {
struct ContextOptions;
}

struct RunOptions {
  std::string output_dir;
  std::uint64_t seed = 0;
  static RunOptions from(const Config& c);
};

struct TrainingOptions {
  std::int64_t max_steps = 0, global_batch = 0, micro_batch = 0, seq_len = 0;
  std::int64_t log_interval = 1, eval_interval = 0, eval_samples = 0, dump_grads_at = 0;
  /// training.sample_*: every sample_interval steps, continue sample_prompt.
  std::int64_t sample_interval = 0, sample_tokens = 32;
  std::string sample_prompt;
  /// data.document_attention: attention stays inside each document.
  bool document_attention = false;
  /// training.dump_routing_steps / dump_activations_steps (steps from 1).
  std::vector<std::int64_t> dump_routing_at, dump_activations_at;
  /// tensor_dump::What bits to collect at `step` (counted from 1).
  unsigned dumps_at(std::int64_t step) const;
  static TrainingOptions from(const Config& c);
};

/// distributed.* as the options of the DistributedContext ("auto" is gloo:
/// this build has no NCCL process group).
dist::ContextOptions context_options(const Config& c);

}  // namespace hp
