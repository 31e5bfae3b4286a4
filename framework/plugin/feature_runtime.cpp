#include "hp/plugin/feature_runtime.h"

#include <algorithm>
#include <stdexcept>

#include "hp/model/extensions.h"
#include "framework/plugin/loader.h"
#include "hp/trainer/executor.h"

namespace hp {

const char* to_string(StepEvent e) {
  switch (e) {
    case StepEvent::kStepBegin: return "step_begin";
    case StepEvent::kAfterForward: return "after_forward";
    case StepEvent::kAfterBackward: return "after_backward";
    case StepEvent::kBeforeOptimizerStep: return "before_optimizer_step";
    case StepEvent::kStepEnd: return "step_end";
    case StepEvent::kSave: return "save";
    case StepEvent::kLoad: return "load";
    case StepEvent::kEval: return "eval";
  }
  return "?";
}

FeatureRuntime::FeatureRuntime(const Config& config, dist::DistributedContext& dist, metrics::Registry* metrics)
    : config_(config), dist_(dist), metrics_(metrics), model_(std::make_unique<ModelExtensions>()) {}

ModelExtensions& FeatureRuntime::model() { return *model_; }

metrics::Registry& FeatureRuntime::metrics() const {
  if (!metrics_) throw std::logic_error("this host has no metrics registry (a tool that runs no training)");
  return *metrics_;
}

FeatureRuntime::~FeatureRuntime() {
  // Hooks and factories may hold code from plugin libraries: clear them
  // while the libraries are still loaded.
  hooks_.clear();
  executor_ = {};
  optimizer_ = {};
  reducer_ = {};
  checkpoint_ = {};
  model_.reset();
}

template <typename T>
void FeatureRuntime::set_owned(Owned<T>& slot, const char* what, const std::string& owner, T value) {
  if (!slot.owner.empty()) {
    throw std::invalid_argument(std::string("the ") + what + " is replaced by both '" + slot.owner + "' and '" +
                                owner + "'");
  }
  if (!value) throw std::invalid_argument("feature '" + owner + "' installs an empty " + what);
  slot.owner = owner;
  slot.value = std::move(value);
}

void FeatureRuntime::set_executor(const std::string& owner, std::shared_ptr<StepExecutor> executor) {
  set_owned(executor_, "step executor", owner, std::move(executor));
}
void FeatureRuntime::set_optimizer(const std::string& owner, OptimizerFactory factory) {
  set_owned(optimizer_, "optimizer", owner, std::move(factory));
}
void FeatureRuntime::set_grad_reducer(const std::string& owner, GradReducerFactory factory) {
  set_owned(reducer_, "gradient reducer", owner, std::move(factory));
}
void FeatureRuntime::set_checkpoint_io(const std::string& owner, CheckpointIOFactory factory) {
  set_owned(checkpoint_, "checkpoint IO", owner, std::move(factory));
}

std::string FeatureRuntime::owner_of(const std::string& c) const {
  if (c == "executor") return executor_.owner;
  if (c == "optimizer") return optimizer_.owner;
  if (c == "gradient reducer") return reducer_.owner;
  if (c == "checkpoint IO") return checkpoint_.owner;
  throw std::invalid_argument("unknown collaborator '" + c +
                              "' (legal: executor, optimizer, gradient reducer, checkpoint IO)");
}

void FeatureRuntime::install(const std::vector<LoadedFeature>& features) {
  for (const auto& f : features) {
    features_.push_back(f);
    try {
      f.feature->install(*this);
    } catch (const std::exception& e) {
      throw PluginError("feature '" + f.name + "' (" + f.path + ") failed to install: " + e.what());
    }
  }
}

bool FeatureRuntime::has_feature(const std::string& name) const {
  return std::any_of(features_.begin(), features_.end(),
                     [&](const LoadedFeature& f) { return f.name == name; });
}

void FeatureRuntime::add_hook(StepEvent event, const std::string& owner, Hook hook) {
  hooks_[event].push_back({owner, std::move(hook)});
}

void FeatureRuntime::run_hooks(StepEvent event, StepContext& ctx) const {
  auto it = hooks_.find(event);
  if (it == hooks_.end()) return;
  for (const auto& h : it->second) {
    try {
      h.fn(ctx);
    } catch (const std::exception& e) {
      throw std::runtime_error("feature '" + h.owner + "' failed in its " + to_string(event) +
                               " hook at step " + std::to_string(ctx.step) + ": " + e.what());
    }
  }
}

std::size_t FeatureRuntime::hook_count(StepEvent event) const {
  auto it = hooks_.find(event);
  return it == hooks_.end() ? 0 : it->second.size();
}

}  // namespace hp
