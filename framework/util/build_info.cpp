#include "framework/util/build_info.h"

namespace hp::build_info {
bool has_cuda() {
#ifdef HP_HAVE_CUDA
  return true;
#else
  return false;
#endif
}
std::string version() { return HP_VERSION; }
std::string install_plugin_dir() { return HP_INSTALL_PLUGIN_DIR_ABS; }
}  // namespace hp::build_info
