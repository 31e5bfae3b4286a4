#pragma once
// Finds and loads feature plugins: the library for feature `name` is
// `libhp_feature_<name>.so`, searched in (1) config `plugins.path`, (2) the
// colon-separated HP_PLUGIN_PATH, (3) the directories next to the installed
// or built framework library. A library once loaded stays loaded for the
// process (a config check per layout does not load it again).
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "hp/plugin/feature.h"

namespace hp {

/// A user-facing plugin problem; what() is one line naming the feature,
/// the file and the cause.
class PluginError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class PluginLoader {
 public:
  explicit PluginLoader(std::vector<std::string> search_path);

  /// `config_paths` first, then HP_PLUGIN_PATH, then the built-in places.
  static std::vector<std::string> default_search_path(const std::vector<std::string>& config_paths);
  static std::string library_file_name(const std::string& feature);

  /// Throws PluginError: not found (with did-you-mean and where it looked),
  /// cannot be loaded, entry point missing, API version mismatch, constructor
  /// failed.
  LoadedFeature load(const std::string& name) const;
  /// Feature names of every plugin library on the search path.
  std::vector<std::string> available() const;
  const std::vector<std::string>& search_path() const { return search_path_; }

 private:
  std::vector<std::string> search_path_;
};

}  // namespace hp
