#pragma once
// The running tool's own executable (to start itself as workers, or its
// neighbour tools from the same directory).
#include <filesystem>
#include <string>
#include <system_error>

namespace hp::tools {

/// /proc/self/exe, or `fallback` (found on PATH) when it cannot be read.
inline std::string self_exe(const char* fallback) {
  std::error_code ec;
  const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(fallback) : p.string();
}

}  // namespace hp::tools
