#include "framework/runtime/setup.h"

#include <algorithm>
#include <set>

#include "framework/plugin/feature.h"
#include "framework/util/strings.h"

namespace hp {

namespace {

std::vector<std::string> raw_plugin_paths(const RawConfig& raw) {
  const RawEntry* e = raw.find("plugins.path");
  if (e && e->kind == RawEntry::Kind::kList) return e->items;
  return {};
}

void check_mesh(Setup& s, const dist::MeshPlan& plan, ConfigErrors& errors) {
  const Config& c = s.config;
  const int world = c.world_size();
  const int tp = plan.size_of("tp"), pp = plan.size_of("pp"), ep = plan.size_of("ep");
  auto by = [&](const std::string& dim) {
    auto it = plan.claims.find(dim);
    return it == plan.claims.end() ? std::string("(none)") : it->second.by;
  };
  std::string shape = "pp=" + std::to_string(pp) + " (" + by("pp") + "), tp=" +
                      std::to_string(tp) + " (" + by("tp") + ")";
  if (!c.ok({"distributed.data_parallel_size"})) return;
  int dp = static_cast<int>(c.get_int("distributed.data_parallel_size"));
  if (dp == 0) {
    if (world % (pp * tp) != 0) {
      errors.add("distributed", "world size " + std::to_string(world),
                 "world size must equal pipeline x data x tensor parallel sizes, but " +
                     std::to_string(world) + " is not a multiple of pp x tp = " +
                     std::to_string(pp * tp) + " [" + shape + "]",
                 "a world size that is a multiple of " + std::to_string(pp * tp) +
                     ", or other pipeline/tensor sizes");
      return;
    }
    dp = world / (pp * tp);
  } else if (static_cast<long long>(pp) * dp * tp != world) {
    errors.add("distributed.data_parallel_size", std::to_string(dp),
               "world size " + std::to_string(world) + " != pp x dp x tp = " +
                   std::to_string(pp) + " x " + std::to_string(dp) + " x " + std::to_string(tp) +
                   " [" + shape + "]",
               world % (pp * tp) == 0 ? std::to_string(world / (pp * tp)) + " or 0 (derive)"
                                      : "0 (derive), after fixing pp x tp to divide " +
                                            std::to_string(world));
    return;
  }
  if (dp % ep != 0) {
    errors.add("distributed", "ep=" + std::to_string(ep) + " dp=" + std::to_string(dp),
               "the expert-parallel size must divide the data-parallel size (claimed by " +
                   by("ep") + ")",
               "an expert-parallel size dividing " + std::to_string(dp));
    return;
  }
  if (c.ok({"training.global_batch_size", "training.micro_batch_size"})) {
    const auto g = c.get_int("training.global_batch_size");
    const auto m = c.get_int("training.micro_batch_size");
    if (g % (m * dp) != 0) {
      errors.add("training.global_batch_size", std::to_string(g),
                 "must be divisible by micro_batch_size x data-parallel size = " +
                     std::to_string(m) + " x " + std::to_string(dp) + " = " +
                     std::to_string(m * dp),
                 "a multiple of " + std::to_string(m * dp));
      return;
    }
  }
  s.mesh = dist::ProcessMesh(pp, dp, tp, ep);
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

  s.config = resolve(s.schema, raw, world_size, errors, skip);

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
      errors.add(key, "true", "feature '" + lf.name + "' (" + lf.path +
                                  ") failed to list its requirements: " + e.what());
      continue;
    }
    for (const auto& need : needs) {
      if (std::find(enabled.begin(), enabled.end(), need) == enabled.end()) {
        errors.add(key, "true", "feature '" + lf.name + "' needs feature '" + need +
                                    "', which is not enabled",
                   "set features." + need + ".enabled: true, or disable " + lf.name);
      }
    }
    for (const auto& other : conflicts) {
      auto me = std::find(enabled.begin(), enabled.end(), lf.name);
      auto it = std::find(enabled.begin(), enabled.end(), other);
      if (it == enabled.end()) continue;
      // One line per pair, at the feature the config names first.
      conflict_pairs.insert(it < me ? std::make_pair(other, lf.name) : std::make_pair(lf.name, other));
    }
  }
  for (const auto& [first, second] : conflict_pairs) {
    errors.add("features." + first + ".enabled", "true",
               "features '" + first + "' and '" + second + "' cannot be enabled together",
               "enable at most one of " + first + ", " + second);
  }

  dist::MeshPlan plan;
  for (const auto& lf : s.features) {
    try {
      lf.feature->validate(s.config, errors);
      lf.feature->plan_mesh(s.config, plan);
    } catch (const std::exception& e) {
      errors.add("features." + lf.name, "", "the feature's validation failed: " + std::string(e.what()));
    }
  }
  for (const auto& c : plan.conflicts) errors.add("features", "", c, "enable one of them");
  if (plan.conflicts.empty()) check_mesh(s, plan, errors);

  errors.throw_if_any();
  return s;
}

}  // namespace hp
