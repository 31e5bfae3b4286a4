#include "framework/runtime/setup.h"

#include <algorithm>
#include <cstdlib>
#include <set>

#include "hp/fault/fault.h"
#include "framework/data/registry.h"
#include "framework/model/registry.h"
#include "hp/plugin/feature.h"
#include "framework/trainer/resume_check.h"
#include "framework/util/strings.h"

namespace hp {

namespace {

std::vector<std::string> raw_plugin_paths(const RawConfig& raw) {
  const RawEntry* e = raw.find("plugins.path");
  if (e && e->kind == RawEntry::Kind::kList) return e->items;
  return {};
}

void check_mesh(Setup& s, dist::MeshPlan& plan, ConfigErrors& errors) {
  const Config& c = s.config;
  if (!c.ok({"distributed.data_parallel_size", "distributed.mesh_order"})) return;
  plan.order = c.get_string("distributed.mesh_order");
  dist::MeshProblem problem;
  if (!dist::resolve_mesh(plan, c.world_size(),
                          static_cast<int>(c.get_int("distributed.data_parallel_size")), s.mesh,
                          problem)) {
    errors.add(problem.key, problem.value, problem.rule, problem.legal);
    return;
  }
  if (c.ok({"training.global_batch_size", "training.micro_batch_size"})) {
    const auto g = c.get_int("training.global_batch_size");
    const auto m = c.get_int("training.micro_batch_size");
    const int dp = plan.replicas;
    if (g % (m * dp) != 0) {
      errors.add(
          "training.global_batch_size", std::to_string(g),
          "must be divisible by micro_batch_size x data-parallel size = " + std::to_string(m) +
              " x " + std::to_string(dp) + " = " + std::to_string(m * dp),
          "a multiple of " + std::to_string(m * dp));
    }
    // Every replica evaluates the same number of whole micro-batches.
    if (c.ok({"training.sample_interval", "training.sample_prompt", "data.type", "model.seq_len"}) &&
        c.get_int("training.sample_interval") > 0) {
      const std::string& kind = c.get_string("data.type");
      const std::string& prompt = c.get_string("training.sample_prompt");
      const auto T = c.get_int("model.seq_len");
      if (kind != "text" && kind != "tokens") {
        errors.add("training.sample_interval", std::to_string(c.get_int("training.sample_interval")),
                   "sampling needs a tokenizer; data.type " + kind + " has none", "0, or data.type text or tokens");
      } else if (prompt.empty()) {
        errors.add("training.sample_prompt", "\"\"", "must not be empty when training.sample_interval > 0",
                   "the text to continue");
      } else if (kind == "text" && static_cast<std::int64_t>(prompt.size()) >= T) {
        errors.add("training.sample_prompt", "(" + std::to_string(prompt.size()) + " bytes)",
                   "is " + std::to_string(prompt.size()) + " byte tokens; model.seq_len " + std::to_string(T) +
                       " holds at most " + std::to_string(T - 1),
                   "a prompt shorter than model.seq_len");
      }
    }
    if (c.ok({"training.eval_samples"})) {
      const auto e = c.get_int("training.eval_samples");
      if (e > 0 && e % (m * dp) != 0) {
        errors.add("training.eval_samples", std::to_string(e),
                   "must be divisible by micro_batch_size x data-parallel size = " + std::to_string(m) + " x " +
                       std::to_string(dp) + " = " + std::to_string(m * dp) +
                       ", so every replica evaluates whole micro-batches",
                   "0 (one global batch), or a multiple of " + std::to_string(m * dp));
      }
    }
  }
}

}  // namespace

Setup prepare(const RawConfig& raw, int world_size) {
  Setup s;
  ConfigErrors errors;
  if (world_size < 1) {
    errors.add("world size", std::to_string(world_size), "must be at least 1", ">= 1");
    errors.throw_if_any();
  }
  s.schema = std::make_shared<Schema>();
  declare_core_options(*s.schema);

  s.plugin_search_path = PluginLoader::default_search_path(raw_plugin_paths(raw));
  PluginLoader loader(s.plugin_search_path);

  std::vector<LoadedFeature> named;
  std::set<std::string> skip;
  for (const auto& name : raw.feature_names()) {
    const std::string prefix = "features." + name + ".";
    try {
      LoadedFeature lf = loader.load(name);
      s.schema->add_bool(prefix + "enabled", false)
          .describe("Switches the " + name + " feature on.");
      try {
        lf.feature->declare_options(*s.schema, prefix);
      } catch (const std::exception& e) {
        throw PluginError("feature '" + name + "' (" + lf.path +
                          ") failed to declare its options: " + e.what());
      }
      named.push_back(std::move(lf));
    } catch (const PluginError& e) {
      const RawEntry* en = raw.find("features." + name + ".enabled");
      errors.add("features." + name, en ? "enabled: " + en->shown() : "", e.what());
      skip.insert("features." + name);
    }
  }

  RawConfig completed = raw;
  complete_data_options(completed);
  s.config = resolve(s.schema, completed, world_size, errors, skip);

  std::vector<std::string> enabled;
  for (const auto& lf : named) {
    const std::string key = "features." + lf.name + ".enabled";
    if (s.config.ok({key.c_str()}) && s.config.get_bool(key)) {
      enabled.push_back(lf.name);
      s.features.push_back(lf);
    }
  }

  std::set<std::pair<std::string, std::string>> conflict_pairs;
  for (const auto& lf : s.features) {
    const std::string key = "features." + lf.name + ".enabled";
    std::vector<std::string> needs, conflicts;
    try {
      needs = lf.feature->required_features();
      conflicts = lf.feature->conflicting_features();
    } catch (const std::exception& e) {
      errors.add(key, "true",
                 "feature '" + lf.name + "' (" + lf.path +
                     ") failed to list its requirements: " + e.what());
      continue;
    }
    for (const auto& need : needs) {
      if (std::find(enabled.begin(), enabled.end(), need) == enabled.end()) {
        errors.add(key, "true",
                   "feature '" + lf.name + "' needs feature '" + need + "', which is not enabled",
                   "set features." + need + ".enabled: true, or disable " + lf.name);
      }
    }
    for (const auto& other : conflicts) {
      auto me = std::find(enabled.begin(), enabled.end(), lf.name);
      auto it = std::find(enabled.begin(), enabled.end(), other);
      if (it == enabled.end()) continue;
      // One line per pair, at the feature the config names first.
      conflict_pairs.insert(it < me ? std::make_pair(other, lf.name)
                                    : std::make_pair(lf.name, other));
    }
  }
  for (const auto& [first, second] : conflict_pairs) {
    errors.add("features." + first + ".enabled", "true",
               "features '" + first + "' and '" + second + "' cannot be enabled together",
               "enable at most one of " + first + ", " + second);
  }

  // Every feature claims its mesh dimensions first; validation then sees
  // the resolved plan, so no feature reads another feature's options.
  dist::MeshPlan plan;
  for (const auto& lf : s.features) {
    try {
      lf.feature->plan_mesh(s.config, plan);
    } catch (const std::exception& e) {
      errors.add("features." + lf.name, "",
                 "the feature's mesh plan failed: " + std::string(e.what()));
    }
  }
  for (const auto& c : plan.conflicts)
    errors.add("features", "", c, "enable only one of the features named, or give a dimension another name in its plugin");
  if (plan.conflicts.empty()) check_mesh(s, plan, errors);

  ModelInfo model;
  if (s.config.ok({"model.type"})) {
    try {
      model = model_info(s.config);
    } catch (const std::exception&) {
      // The model's options were refused on their own; features see no sizes.
    }
  }
  const FeatureContext ctx{s.config, model, plan};
  for (const auto& lf : s.features) {
    try {
      lf.feature->validate(ctx, errors);
    } catch (const std::exception& e) {
      errors.add("features." + lf.name, "",
                 "the feature's validation failed: " + std::string(e.what()));
    }
  }

  // The fault points tests arm (HP_FAULT_INJECT): a misspelt one would
  // silently never fire.
  const std::string unknown = fault::unknown_points();
  if (!unknown.empty()) {
    errors.add(fault::kVariable, std::getenv(fault::kVariable),
               "names an unknown fault point: " + unknown,
               fault::legal_points() + "; several separated by commas");
  }
  // A resume is compared with the config its checkpoint stores; only a config
  // valid otherwise is worth the look.
  if (errors.empty()) check_resume_config(s.config, model, errors);

  errors.throw_if_any();
  return s;
}

}  // namespace hp
