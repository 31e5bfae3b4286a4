#pragma once
// A path the build gives relative to the test executable's own directory
// (not as an absolute path: an absolute path compiled into a test differs
// between checkouts, and every checkout would then miss ccache on it).
#include <filesystem>
#include <string>

namespace hp::test {

/// `relative` (to the directory of the running executable), made absolute.
inline std::string beside_executable(const std::string& relative) {
  const auto self = std::filesystem::read_symlink("/proc/self/exe");
  return (self.parent_path() / relative).lexically_normal().string();
}

}  // namespace hp::test
