#pragma once
// Facts fixed when hyperparallel was compiled.
#include <string>

namespace hp::build_info {
/// Whether LibTorch was built with CUDA (and so the NCCL backend exists).
bool has_cuda();
std::string version();
/// Compiled-in plugin install directory.
std::string install_plugin_dir();
}  // namespace hp::build_info
