#include "framework/util/blas_check.h"

#include <fstream>

namespace hp {

std::string loaded_blas() {
  std::ifstream maps("/proc/self/maps");
  std::string line, found;
  while (std::getline(maps, line)) {
    auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    std::string path = line.substr(slash);
    if (path.find("openblas") != std::string::npos) return path;
    if (path.find("libblas.so") != std::string::npos) found = path;
  }
  return found;
}

void warn_if_reference_blas(spdlog::logger& log) {
  const std::string blas = loaded_blas();
  if (!blas.empty() && blas.find("openblas") == std::string::npos &&
      blas.find("mkl") == std::string::npos && blas.find("blis") == std::string::npos) {
    log.warn(
        "LibTorch is using the reference BLAS ({}), about 20x slower for training; install "
        "libopenblas0-openmp (scripts/install-deps.sh does) or select OpenBLAS with "
        "update-alternatives --config libblas.so.3-x86_64-linux-gnu",
        blas);
  }
}

}  // namespace hp
