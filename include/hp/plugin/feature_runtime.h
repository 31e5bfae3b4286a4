#pragma once
// The extension points a feature installs into. The runtime keeps every
// installed feature (and so its library) alive for as long as it lives, and
// drops everything features registered before releasing them.
//
// Replaceable collaborators (each owned by at most one feature; a second is
// refused naming both):
//   executor        block placement and the order of forwards/backwards
//   optimizer       the update, with its state keyed by global parameter name
//   gradient reducer how gradients are summed over the replicating groups,
//                   clipped, and reported
//   checkpoint IO   how parameters, optimizer state and run state are saved
//                   and loaded
// and shared ones: the layer registry and forward wrappers (model()), step
// hooks that see a StepContext, and the host's metrics registry.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hp/plugin/feature.h"

namespace hp {

class Config;
class ModelExtensions;  // include/hp/model/extensions.h
class StepExecutor;     // include/hp/trainer/executor.h
class Optimizer;        // include/hp/optim/optimizer.h
class GradReducer;      // include/hp/optim/grad_sync.h
class CheckpointIO;     // include/hp/trainer/checkpoint_adapter.h
struct OptimizerOptions;
struct ReducerOptions;
struct CheckpointOptions;
struct ParamEntry;
namespace dist {
class DistributedContext;
}
namespace metrics {
class Registry;
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

/// What a hook sees. Pointers are null where the event has no such thing
/// yet (the optimizer before the model is built).
struct StepContext {
  std::int64_t step = 0;
  /// The step's global mean loss; 0 before the loss is known (step_begin,
  /// after_forward).
  double loss = 0.0;
  /// This rank's parameters with their ShardSpecs; .grad() holds gradients.
  const std::vector<ParamEntry>* params = nullptr;
  Optimizer* optimizer = nullptr;
  dist::DistributedContext* dist = nullptr;
  metrics::Registry* metrics = nullptr;
  /// Figures of this step, written to metrics.jsonl and exported as gauges
  /// hp_<name>; a hook may add its own.
  std::map<std::string, double>* figures = nullptr;
};

using OptimizerFactory = std::function<std::unique_ptr<Optimizer>(
    const OptimizerOptions&, const std::vector<ParamEntry>&, dist::DistributedContext&)>;
using GradReducerFactory = std::function<std::unique_ptr<GradReducer>(
    const ReducerOptions&, const std::vector<ParamEntry>&, dist::DistributedContext&)>;
using CheckpointIOFactory =
    std::function<std::unique_ptr<CheckpointIO>(const CheckpointOptions&, const Config&, dist::DistributedContext&)>;

class FeatureRuntime {
 public:
  using Hook = std::function<void(StepContext&)>;

  /// `metrics` is the host's registry (null in tools that run no training).
  FeatureRuntime(const Config& config, dist::DistributedContext& dist, metrics::Registry* metrics = nullptr);
  ~FeatureRuntime();
  FeatureRuntime(const FeatureRuntime&) = delete;
  FeatureRuntime& operator=(const FeatureRuntime&) = delete;

  const Config& config() const { return config_; }
  /// Always present: a single-rank context where there is one process.
  dist::DistributedContext& dist() const { return dist_; }
  /// The host's metrics registry, for a feature's own series (with labels).
  /// Throws when the host has none.
  metrics::Registry& metrics() const;
  bool has_metrics() const { return metrics_ != nullptr; }

  /// Calls `install` of each feature in order; a throwing install becomes a
  /// PluginError naming the feature.
  void install(const std::vector<LoadedFeature>& features);
  const std::vector<LoadedFeature>& features() const { return features_; }
  bool has_feature(const std::string& name) const;

  /// Layer registry and forward wrappers (include include/hp/model/extensions.h).
  ModelExtensions& model();

  /// Replaces the sequential step executor.
  void set_executor(const std::string& owner, std::shared_ptr<StepExecutor> executor);
  /// The installed executor, or null for the sequential one.
  std::shared_ptr<StepExecutor> executor() const { return executor_.value; }

  /// Replaces the optimizer (called once the model's parameters exist).
  void set_optimizer(const std::string& owner, OptimizerFactory factory);
  const OptimizerFactory& optimizer_factory() const { return optimizer_.value; }
  /// Replaces the gradient reducer (bucketed all-reduce over the replicating groups).
  void set_grad_reducer(const std::string& owner, GradReducerFactory factory);
  const GradReducerFactory& grad_reducer_factory() const { return reducer_.value; }
  /// Replaces the checkpoint IO (gathered, one writer per pipeline stage).
  void set_checkpoint_io(const std::string& owner, CheckpointIOFactory factory);
  const CheckpointIOFactory& checkpoint_io_factory() const { return checkpoint_.value; }
  /// Which feature owns a collaborator ("executor", "optimizer",
  /// "gradient reducer", "checkpoint IO"); "" for the built-in one.
  std::string owner_of(const std::string& collaborator) const;

  void add_hook(StepEvent event, const std::string& owner, Hook hook);
  void run_hooks(StepEvent event, StepContext& ctx) const;
  std::size_t hook_count(StepEvent event) const;

 private:
  template <typename T>
  struct Owned {
    std::string owner;
    T value{};
  };
  template <typename T>
  void set_owned(Owned<T>& slot, const char* what, const std::string& owner, T value);

  // Declared first so it is destroyed last: everything below may hold code
  // from the plugin libraries these keep loaded.
  std::vector<LoadedFeature> features_;
  const Config& config_;
  dist::DistributedContext& dist_;
  metrics::Registry* metrics_;
  struct NamedHook {
    std::string owner;
    Hook fn;
  };
  std::map<StepEvent, std::vector<NamedHook>> hooks_;
  std::unique_ptr<ModelExtensions> model_;
  Owned<std::shared_ptr<StepExecutor>> executor_;
  Owned<OptimizerFactory> optimizer_;
  Owned<GradReducerFactory> reducer_;
  Owned<CheckpointIOFactory> checkpoint_;
};

}  // namespace hp
