#pragma once
// The Trainer: config in, a trained model out.
//
//   hp::Trainer trainer = hp::Trainer::from_file("gpt.yaml");
//   trainer.enable("recompute", {{"granularity", "selective"}});
//   auto result = trainer.fit();
//
// The model and the dataset are the registry entries `model.type` and
// `data.type` name; register your own with hp::models().add(...) and
// hp::datasets().add(...) before fit (see examples/custom_model).
//
// `enable` is the C++ twin of `features.<name>.enabled: true`. fit()
// validates everything first (a bad config throws hp::ConfigException before
// any process group exists), then joins the job described by the environment
// (torchrun / hp-launch / Slurm / Open MPI variables, or one process).
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hp/config/config.h"

namespace hp {

struct FitResult {
  std::int64_t first_step = 0;  ///< first step run by this fit (after a resume: checkpoint step)
  std::int64_t last_step = 0;   ///< steps completed in total
  std::vector<double> losses;   ///< training loss of each step run, averaged per token
  double last_eval_loss = std::numeric_limits<double>::quiet_NaN();
  /// Tokens over wall time of the steps run, excluding the first (warm-up).
  double tokens_per_second = 0;
};

/// What Trainer::evaluate() measured.
struct EvalResult {
  std::int64_t step = 0;     ///< the checkpoint's step
  double loss = 0;           ///< mean per-token cross entropy (nats) over the validation samples
  std::int64_t samples = 0;  ///< training.eval_samples (0 resolved to the global batch)
  std::int64_t seq = 0;      ///< model.seq_len
};

/// What Trainer::generate() decodes: prompts as token ids, and how.
struct GenerateOptions {
  std::vector<std::vector<std::int64_t>> prompts;
  std::int64_t max_new_tokens = 32;
  /// 0: greedy (the most likely token; the lowest id among equals).
  /// Otherwise sampling at this temperature, from the top_k most likely
  /// (0: all) within the smallest set of probability >= top_p.
  double temperature = 0;
  std::int64_t top_k = 0;
  double top_p = 1.0;
  std::uint64_t seed = 1;
  /// Ends a prompt's generation (the end-of-document token); -1: none.
  std::int64_t stop_token = -1;
  /// Tokens at or above this id are never chosen (the tokenizer's
  /// vocabulary inside a padded model vocabulary); 0: no limit.
  std::int64_t vocab_limit = 0;
  /// Micro-batches each rank's requests are cut into (a pipeline's stages
  /// work on different ones at once); requests are padded to a multiple.
  std::int64_t micro_batches = 1;
  /// Keys and values of the context cached (a prefill, then one position
  /// per step); false: every step recomputes the whole context.
  bool kv_cache = true;
  /// After generating, score each whole sequence with the trainer's
  /// forward (no cache, padded to model.seq_len): GenerateResult::teacher_forced.
  bool teacher_forcing = false;
  /// Called on rank 0 with (prompt, token) as each token is chosen.
  std::function<void(std::size_t, std::int64_t)> on_token;
};

struct GenerateResult {
  std::int64_t step = 0;  ///< the checkpoint's step
  /// Per prompt: the generated tokens (the stop token included) and the
  /// log-probability the model gave each.
  std::vector<std::vector<std::int64_t>> tokens;
  std::vector<std::vector<double>> log_probs;
  /// The gap between the two most likely tokens' log-probabilities at each
  /// choice (where layouts may pick differently when it is within rounding).
  std::vector<std::vector<double>> top2_gaps;
  /// Seconds of the first step (the prefill, with the cache) and of the
  /// decode steps after it, on this rank.
  double prefill_seconds = 0, decode_seconds = 0;
  std::int64_t decode_steps = 0;
  /// Bytes this rank sent over every group during the decode steps.
  std::uint64_t decode_bytes = 0;
  /// The key/value cache on this rank (zeros without it): its bytes, the
  /// bytes one position of one sample takes, and that figure's terms
  /// (layers x 2 x kv_heads x head_dim x element_bytes).
  std::int64_t kv_bytes = 0, kv_bytes_per_token = 0;
  std::int64_t kv_layers = 0, kv_heads = 0, kv_head_dim = 0, kv_element_bytes = 0;
  /// With GenerateOptions::teacher_forcing: per prompt, the sum of the
  /// generated tokens' log-probabilities computed by one forward over the
  /// whole sequence (equal to the sum of log_probs up to rounding).
  std::vector<double> teacher_forced;
  /// Parameters a placement splits over ranks (counted on this rank), and
  /// how many of them some rank nonetheless holds whole (0: generation ran
  /// on the split weights, never on consolidated ones).
  std::int64_t split_params = 0, split_params_held_whole = 0;
};

class Trainer {
 public:
  explicit Trainer(RawConfig raw);
  static Trainer from_file(const std::string& path, const std::vector<std::string>& overrides = {});
  static Trainer from_yaml(const std::string& yaml);

  /// Sets one key (value parsed as YAML), as `--set key=value` does.
  Trainer& set(const std::string& key, const std::string& yaml_value);
  /// Enables a feature with its options, e.g.
  /// enable("recompute", {{"granularity", "full"}}).
  Trainer& enable(const std::string& feature, const std::map<std::string, std::string>& options = {});

  /// Trains the model and data named by the config.
  FitResult fit();
  /// Loads the checkpoint `checkpoint.resume` names at this config's layout
  /// and evaluates it on the validation samples training evaluates
  /// (training.eval_samples of data's validation split): no step, no save.
  /// Throws std::runtime_error when no checkpoint is named.
  EvalResult evaluate();
  /// Generator(raw_config()).generate(options): loads the checkpoint
  /// `checkpoint.resume` names at this config's layout and continues each prompt one token at a time at this layout: a
  /// prefill of the prompts, then one position per step over the cached
  /// keys and values (GenerateOptions::kv_cache; without it, or under
  /// context parallel, the whole context padded to model.seq_len runs each
  /// step). Every rank returns the same tokens.
  GenerateResult generate(const GenerateOptions& options);

  const RawConfig& raw_config() const { return raw_; }

 private:
  RawConfig raw_;
};

class Tokenizer;

/// Generation from a checkpoint at any layout, the model loaded once and
/// kept for every call (hp-generate is built on it).
///
///   auto g = hp::Generator::from_checkpoint("runs/x/checkpoints", {"features.tensor_parallel.enabled=true", ...});
///   auto texts = g.generate_text({"The computer"});
///
/// Every rank of the layout constructs one and calls it with the same
/// arguments; every rank returns the same tokens.
class Generator {
 public:
  /// Loads, at the first call, the checkpoint `checkpoint.resume` names in
  /// `raw`, at raw's layout (a Trainer's config: Generator(trainer.raw_config())).
  explicit Generator(RawConfig raw);
  /// A checkpoint step directory, or a root (its latest committed step):
  /// the config stored with it, then `overrides` ("key=value"); nothing
  /// trains or saves; the run's files go to a new temporary directory
  /// unless an override names run.output_dir.
  static Generator from_checkpoint(const std::string& path, const std::vector<std::string>& overrides = {});
  ~Generator();
  Generator(Generator&&) noexcept;
  Generator& operator=(Generator&&) noexcept;

  /// Continues token-id prompts (GenerateOptions).
  GenerateResult generate(const GenerateOptions& options);
  /// Continues text prompts with the run's tokenizer (stopping at its
  /// end-of-document token, never choosing an id beyond its vocabulary);
  /// returns the generated text of each (the prompt not repeated).
  std::vector<std::string> generate_text(const std::vector<std::string>& prompts, GenerateOptions options = {});
  /// The tokenizer the checkpoint's run read its data with.
  const Tokenizer& tokenizer();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hp
