#pragma once
// One logger owned by the host, shared with plugins (spdlog is linked as a
// shared library so there is one registry). Every line is tagged with the
// global rank and the mesh coordinates.
#include <spdlog/spdlog.h>

#include <memory>
#include <string>

namespace hp::log {

/// (Re)configures the host logger. `level` is trace|debug|info|warn|error|off;
/// the environment variable HP_LOG_LEVEL, when set, wins. `file` (optional)
/// receives the same lines.
void init(int rank, const std::string& mesh_tag, const std::string& level,
          const std::string& file = "");

/// The host logger (created with rank 0 defaults on first use).
std::shared_ptr<spdlog::logger> logger();

}  // namespace hp::log
