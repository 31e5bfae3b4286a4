#include "framework/trainer/resume_check.h"

#include <map>

#include "checkpoint/reader.h"
#include "hp/config/config.h"
#include "hp/model/model_info.h"
#include "framework/model/registry.h"
#include "hp/trainer/checkpoint_adapter.h"

namespace hp {

namespace {

bool compared(const std::string& key) {
  return key.rfind("model.", 0) == 0 || key.rfind("training.", 0) == 0 ||
         key.rfind("optimizer.", 0) == 0;
}

/// Leaf values by dotted key, as the YAML shows them.
std::map<std::string, std::string> leaves(const std::string& yaml, const std::string& origin) {
  std::map<std::string, std::string> out;
  const RawConfig raw = RawConfig::parse_string(yaml, origin);
  for (const auto& e : raw.entries()) {
    if (e.kind == RawEntry::Kind::kMap || !compared(e.path)) continue;
    out[e.path] = e.shown();
  }
  return out;
}

constexpr const char* kNotRecorded = "(not recorded)";
constexpr const char* kNotAnOption = "(not an option here)";

/// The model's free keys; none when the model's options do not resolve.
std::set<std::string> free_keys_of(const Config& config) {
  try {
    return model_info(config).free_keys;
  } catch (const std::exception&) {
    return {};
  }
}

}  // namespace

ConfigDiff diff_configs(const std::string& stored_yaml, const Config& current,
                        const std::set<std::string>& free_keys) {
  const auto before = leaves(stored_yaml, "the checkpoint's config.yaml");
  const auto after = leaves(current.to_yaml(), "<resolved config>");
  std::map<std::string, KeyChange> changes;
  for (const auto& [key, value] : before) {
    auto it = after.find(key);
    const std::string now = it == after.end() ? kNotAnOption : it->second;
    if (now != value) changes[key] = {key, value, now};
  }
  for (const auto& [key, value] : after) {
    if (!before.count(key)) changes[key] = {key, kNotRecorded, value};
  }
  ConfigDiff diff;
  for (auto& [key, change] : changes) {
    if (key.rfind("model.", 0) != 0) {
      diff.training.push_back(std::move(change));
    } else if (free_keys.count(key) || change.before == kNotRecorded ||
               change.after == kNotAnOption) {
      diff.model_free.push_back(std::move(change));
    } else {
      diff.model.push_back(std::move(change));
    }
  }
  return diff;
}

std::string describe_changes(const std::vector<KeyChange>& changes) {
  std::string out;
  for (const auto& c : changes)
    out += (out.empty() ? "" : ", ") + c.key + " " + c.before + " -> " + c.after;
  return out;
}

void check_resume_config(const Config& config, const ModelInfo& model, ConfigErrors& errors) {
  if (!config.ok({"checkpoint.resume", "checkpoint.dir", "run.output_dir", "checkpoint.strict"}))
    return;
  std::string dir, stored;
  try {
    dir = CheckpointOptions::from(config).resume_dir();
  } catch (const std::exception&) {
    return;  // the resume reports an unusable checkpoint.dir with its own error
  }
  if (dir.empty()) return;
  try {
    stored = ckpt::CheckpointReader(dir).config_text();
  } catch (const std::exception& e) {
    // Refused before any process starts: a missing or damaged file would
    // otherwise stop whichever rank reads it first.
    errors.add("checkpoint.resume", dir, e.what(), "another committed step directory, or never");
    return;
  }
  if (stored.empty() || !config.get_bool("checkpoint.strict")) return;
  ConfigDiff diff;
  try {
    diff = diff_configs(stored, config, model.free_keys);
  } catch (const std::exception& e) {
    errors.add("checkpoint.resume", dir,
               std::string("the checkpoint's config.yaml does not parse: ") + e.what(),
               "resume from another step");
    return;
  }
  if (diff.model.empty()) return;
  std::string free;
  for (const auto& k : model.free_keys) free += (free.empty() ? "" : ", ") + k;
  errors.add("checkpoint.resume", dir,
             "the checkpoint was written with other model options (checkpoint -> this run): " +
                 describe_changes(diff.model) + "; its tensors would not match the model",
             "the checkpoint's model options" +
                 (free.empty() ? std::string() : " (free to change: " + free + ")") +
                 "; checkpoint.strict: false to load what fits (fine-tuning); checkpoint.resume: "
                 "never or another "
                 "checkpoint.dir to start afresh");
}

bool predates_weight_decay_groups(const std::string& stored_yaml) {
  if (stored_yaml.empty()) return false;
  const RawConfig raw = RawConfig::parse_string(stored_yaml, "the checkpoint's config.yaml");
  return raw.find("optimizer.weight_decay_on") == nullptr;
}

std::string describe_precision(const std::string& param_dtype, const std::string& reduce_dtype) {
  if (param_dtype.empty()) return "not recorded";
  if (param_dtype == "fp32" && reduce_dtype == "fp32") return "fp32";
  return param_dtype + " compute (gradient sums in " + reduce_dtype + ")";
}

std::vector<std::string> resume_config_notes(const std::string& stored_yaml, const Config& config,
                                             const std::string& step_dir, const std::string& stored_precision,
                                             const std::string& current_precision) {
  std::vector<std::string> out;
  // Precision is a training choice: the checkpoint holds fp32 masters
  // whichever precision wrote it, so a change is logged, never refused. A
  // checkpoint that does not record its precision is said so only when this
  // run trains in something other than fp32 (every such checkpoint before
  // precisions were recorded trained in fp32, or was imported).
  if (stored_precision == "not recorded") {
    if (current_precision != "fp32")
      out.push_back("resuming in " + current_precision +
                    " from a checkpoint that does not record its precision (written before precisions were "
                    "recorded, or imported; its tensors are fp32 and are loaded as they are)");
  } else if (stored_precision != current_precision) {
    out.push_back("resuming in another precision: the checkpoint was written in " + stored_precision +
                  ", this run trains in " + current_precision +
                  " (the checkpoint holds fp32 masters, loaded as they are)");
  }
  if (stored_yaml.empty()) {
    out.push_back("checkpoint " + step_dir +
                  " stores no config (written before checkpoints stored theirs): the config could not be "
                  "compared");
    return out;
  }
  const ConfigDiff diff = diff_configs(stored_yaml, config, free_keys_of(config));
  if (!diff.training.empty())
    out.push_back("resuming with changed training options: " + describe_changes(diff.training));
  if (!diff.model_free.empty()) {
    out.push_back("resuming with changed model options the model declares free to change: " +
                  describe_changes(diff.model_free));
  }
  if (!diff.model.empty()) {
    out.push_back("partial load (checkpoint.strict: false) with changed model options: " +
                  describe_changes(diff.model));
  }
  return out;
}

}  // namespace hp
