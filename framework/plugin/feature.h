#pragma once
// The interface every feature plugin implements, and the one entry point a
// plugin library exports. Kept free of LibTorch so that plugins and config
// validation compile quickly.
#include <memory>
#include <string>
#include <vector>

namespace hp {

class Schema;
class Config;
class ConfigErrors;
class FeatureRuntime;
namespace dist {
struct MeshPlan;
}

/// Bumped whenever Feature or FeatureRuntime change incompatibly. A plugin
/// built for another version is refused on load with both numbers.
constexpr int kFeatureApiVersion = 1;

/// A switchable feature (pipeline, tensor parallel, recompute, ...). The host
/// calls, in order: declare_options, (config resolved) validate, plan_mesh,
/// then install once the mesh and process groups exist.
class Feature {
 public:
  virtual ~Feature() = default;

  /// Declares this feature's options under `prefix` ("features.<name>.");
  /// `enabled` is declared by the host.
  virtual void declare_options(Schema& schema, const std::string& prefix) const {
    (void)schema;
    (void)prefix;
  }
  /// Features that must also be enabled.
  virtual std::vector<std::string> required_features() const { return {}; }
  /// Features that cannot be enabled together with this one.
  virtual std::vector<std::string> conflicting_features() const { return {}; }
  /// Rules across this feature's options, the model and the world size.
  virtual void validate(const Config& config, ConfigErrors& errors) const {
    (void)config;
    (void)errors;
  }
  /// Claims mesh dimensions (tp, pp, ep, cp).
  virtual void plan_mesh(const Config& config, dist::MeshPlan& plan) const {
    (void)config;
    (void)plan;
  }
  /// Registers layer kinds, block wrappers, step hooks, checkpoint IO.
  virtual void install(FeatureRuntime& runtime) { (void)runtime; }
};

namespace plugin_abi {
/// Signature of the exported create function. It never throws: on failure it
/// returns nullptr and writes the reason to `error`.
using CreateFn = Feature*(std::string* error);
constexpr const char* kApiVersionSymbol = "hp_feature_api_version";
constexpr const char* kCreateSymbol = "hp_feature_create";
}  // namespace plugin_abi

}  // namespace hp

/// Put once in a plugin's .cpp: exports the API version and a create function
/// (Boost.DLL aliases) for `FeatureClass`, which must be default-constructible.
/// Exceptions thrown by the constructor are caught here, never crossing the
/// library boundary.
#define HP_FEATURE_PLUGIN(FeatureClass)                                        \
  namespace hp_plugin_entry {                                                  \
  const int api_version = ::hp::kFeatureApiVersion;                            \
  ::hp::Feature* create(std::string* error) noexcept {                         \
    try {                                                                      \
      return new FeatureClass();                                               \
    } catch (const std::exception& e) {                                        \
      *error = e.what();                                                       \
    } catch (...) {                                                            \
      *error = "unknown exception";                                            \
    }                                                                          \
    return nullptr;                                                            \
  }                                                                            \
  }                                                                            \
  BOOST_DLL_ALIAS(hp_plugin_entry::api_version, hp_feature_api_version)        \
  BOOST_DLL_ALIAS(hp_plugin_entry::create, hp_feature_create)
