#pragma once
// The extension points a feature installs into. The runtime keeps every
// installed feature (and so its library) alive for as long as it lives, and
// drops everything features registered before releasing them.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "framework/plugin/loader.h"

namespace hp {

class Config;
class ModelExtensions;  // framework/model/extensions.h
class StepExecutor;     // framework/trainer/executor.h
namespace dist {
class DistributedContext;
}

/// Points in a training step where features may act.
enum class StepEvent {
  kStepBegin,
  kAfterForward,
  kAfterBackward,
  kBeforeOptimizerStep,
  kStepEnd,
  kSave,
  kLoad,
  kEval,
};
const char* to_string(StepEvent e);

struct StepInfo {
  std::int64_t step = 0;
  double loss = 0.0;
};

class FeatureRuntime {
 public:
  using Hook = std::function<void(const StepInfo&)>;

  FeatureRuntime(const Config& config, dist::DistributedContext* dist);
  ~FeatureRuntime();
  FeatureRuntime(const FeatureRuntime&) = delete;
  FeatureRuntime& operator=(const FeatureRuntime&) = delete;

  const Config& config() const { return config_; }
  /// Null before process groups exist (e.g. in --dry-run).
  dist::DistributedContext* dist() const { return dist_; }

  /// Calls `install` of each feature in order; a throwing install becomes a
  /// PluginError naming the feature.
  void install(const std::vector<LoadedFeature>& features);
  const std::vector<LoadedFeature>& features() const { return features_; }
  bool has_feature(const std::string& name) const;

  /// Layer registry and forward wrappers (include framework/model/extensions.h).
  ModelExtensions& model();

  /// Replaces the sequential step executor (block placement and the order
  /// of forwards and backwards); one feature at most, a second is refused
  /// naming both.
  void set_executor(const std::string& owner, std::shared_ptr<StepExecutor> executor);
  /// The installed executor, or null for the sequential one.
  std::shared_ptr<StepExecutor> executor() const { return executor_; }

  void add_hook(StepEvent event, const std::string& owner, Hook hook);
  void run_hooks(StepEvent event, const StepInfo& info) const;
  std::size_t hook_count(StepEvent event) const;

 private:
  // Declared first so it is destroyed last: everything below may hold code
  // from the plugin libraries these keep loaded.
  std::vector<LoadedFeature> features_;
  const Config& config_;
  dist::DistributedContext* dist_;
  struct NamedHook {
    std::string owner;
    Hook fn;
  };
  std::map<StepEvent, std::vector<NamedHook>> hooks_;
  std::unique_ptr<ModelExtensions> model_;
  std::string executor_owner_;
  std::shared_ptr<StepExecutor> executor_;
};

}  // namespace hp
