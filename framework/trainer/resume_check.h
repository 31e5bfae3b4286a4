#pragma once
// A resume compared with the checkpoint it resumes: the resolved config the
// checkpoint stores (config.yaml) against the run's own, key by key.
//
//   model.*                  a changed key is refused before any process
//                            starts, naming each key with both values, unless
//                            the model declares it free to change
//                            (ModelInfo::free_keys) or the load is partial
//                            (checkpoint.strict: false);
//   training.*, optimizer.*  a changed key is logged, one line.
//
// A checkpoint without a stored config (written before configs were stored,
// or imported) is not compared; one log line says so. Free of LibTorch.
#include <set>
#include <string>
#include <vector>

namespace hp {

class Config;
class ConfigErrors;
struct ModelInfo;

struct KeyChange {
  std::string key;
  std::string before;  ///< the checkpoint's value, "(not recorded)" when its config lacks the key
  std::string after;   ///< this run's value, "(not an option here)" when this build lacks it
};

struct ConfigDiff {
  std::vector<KeyChange> model;  ///< model.* keys changed that are not free
  std::vector<KeyChange>
      model_free;  ///< model.* keys changed that the model declares free, or on one side only
  std::vector<KeyChange> training;  ///< training.* and optimizer.* keys changed
};

/// Compares the model.*, training.* and optimizer.* keys of `stored_yaml`
/// (a checkpoint's config.yaml) with `current`'s. Throws ConfigException
/// when `stored_yaml` is not YAML.
ConfigDiff diff_configs(const std::string& stored_yaml, const Config& current,
                        const std::set<std::string>& free_keys);

/// "model.layers 4 -> 2, model.hidden 64 -> 32"
std::string describe_changes(const std::vector<KeyChange>& changes);

/// Before any process starts (prepare()): when the run resumes (per
/// checkpoint.resume) from a checkpoint that stores its config, adds one
/// error on `checkpoint.resume` naming every changed model key that `model`
/// does not declare free, unless checkpoint.strict is false. A checkpoint it
/// cannot read is left to the resume itself to report.
void check_resume_config(const Config& config, const ModelInfo& model, ConfigErrors& errors);

/// Whether a checkpoint's stored config (non-empty) was written before
/// weight-decay groups existed (it lacks optimizer.weight_decay_on): such a
/// run decayed every parameter. Throws ConfigException when not YAML.
bool predates_weight_decay_groups(const std::string& stored_yaml);

/// A precision as recorded in a checkpoint's state (the dtype names of the
/// model's PrecisionPolicy): "fp32", or "bf16 compute (gradient sums in
/// fp32)"; masters are fp32 in both. "not recorded" when `param_dtype` is
/// empty (a checkpoint written before precisions were recorded, or imported).
std::string describe_precision(const std::string& param_dtype, const std::string& reduce_dtype);

/// At the resume: the lines to log about `stored_yaml` (the checkpoint's
/// config, "" when it has none) against `config`: the config could not be
/// compared; training/optimizer keys changed; free model keys changed; model
/// keys changed under a partial load; and, when `stored_precision` and
/// `current_precision` (describe_precision's) differ, the change of
/// precision (logged, never refused: the checkpoint holds fp32 masters).
/// Empty when nothing differs.
std::vector<std::string> resume_config_notes(const std::string& stored_yaml, const Config& config,
                                             const std::string& step_dir,
                                             const std::string& stored_precision = "not recorded",
                                             const std::string& current_precision = "fp32");

}  // namespace hp
