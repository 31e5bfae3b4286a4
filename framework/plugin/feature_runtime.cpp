#include "framework/plugin/feature_runtime.h"

#include "framework/trainer/executor.h"

#include <algorithm>

#include "framework/model/extensions.h"

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

FeatureRuntime::FeatureRuntime(const Config& config, dist::DistributedContext* dist)
    : config_(config), dist_(dist), model_(std::make_unique<ModelExtensions>()) {}

ModelExtensions& FeatureRuntime::model() { return *model_; }

FeatureRuntime::~FeatureRuntime() {
  // Hooks may hold code from plugin libraries: clear them while the
  // libraries are still loaded.
  hooks_.clear();
  executor_.reset();
  model_.reset();
}

void FeatureRuntime::set_executor(const std::string& owner, std::shared_ptr<StepExecutor> executor) {
  if (executor_) {
    throw std::invalid_argument("the step executor is replaced by both '" + executor_owner_ + "' and '" +
                                owner + "'");
  }
  executor_owner_ = owner;
  executor_ = std::move(executor);
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

void FeatureRuntime::run_hooks(StepEvent event, const StepInfo& info) const {
  auto it = hooks_.find(event);
  if (it == hooks_.end()) return;
  for (const auto& h : it->second) {
    try {
      h.fn(info);
    } catch (const std::exception& e) {
      throw std::runtime_error("feature '" + h.owner + "' failed in its " + to_string(event) +
                               " hook at step " + std::to_string(info.step) + ": " + e.what());
    }
  }
}

std::size_t FeatureRuntime::hook_count(StepEvent event) const {
  auto it = hooks_.find(event);
  return it == hooks_.end() ? 0 : it->second.size();
}

}  // namespace hp
