#pragma once
// Everything that can be checked before a process group exists: the config
// against the schema (core + every named feature's options), the features'
// own rules, requirements and conflicts between features, and the mesh.
#include <memory>
#include <string>
#include <vector>

#include "hp/comm/mesh.h"
#include "hp/config/config.h"
#include "framework/plugin/loader.h"

namespace hp {

struct Setup {
  std::shared_ptr<Schema> schema;
  Config config;
  /// Enabled features, loaded, in the order the config names them.
  std::vector<LoadedFeature> features;
  dist::ProcessMesh mesh;
  std::vector<std::string> plugin_search_path;
};

/// Resolves and validates `raw` for a job of `world_size` processes. Throws
/// ConfigException carrying every problem found (one line each).
Setup prepare(const RawConfig& raw, int world_size);

}  // namespace hp
