#include "framework/util/blas_check.h"

#include <dlfcn.h>

#include <cstdlib>
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

bool set_blas_threads(int n) {
  bool found = false;
  // Looked up at run time: the library is whichever libblas.so.3 the
  // alternatives system selected, so nothing can be linked against it.
  if (auto* openblas = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    openblas(n);
    found = true;
  }
  if (auto* omp = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"))) {
    omp(n);
    found = true;
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

std::string openblas_core() {
  if (auto* name = reinterpret_cast<char* (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_corename")))
    if (const char* n = name()) return n;
  return "";
}

std::string openblas_kernels() {
  const std::string core = openblas_core();
  if (core.empty()) return "";
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  if (env && *env) return core + " (OPENBLAS_CORETYPE=" + env + ")";
  return core + " (detected by OpenBLAS; OPENBLAS_CORETYPE unset)";
}

std::string openblas_kernel_hint() {
  const std::string core = openblas_core();
  if (core != "Haswell" && core != "Zen") return "";
  if (std::getenv("OPENBLAS_CORETYPE")) return "";
#if defined(__x86_64__)
  if (!__builtin_cpu_supports("avx512f")) return "";
#else
  return "";
#endif
  return "OpenBLAS runs its " + core +
         " (AVX2) kernels on this CPU, which has AVX-512F; OPENBLAS_CORETYPE=SKYLAKEX in the "
         "environment of every rank selects its AVX-512 kernels (fp32 products about 1.7x faster "
         "on the project's machines, rounded differently; docs/toolchain.md, section 4)";
}

void note_openblas_kernels(spdlog::logger& log) {
  const std::string kernels = openblas_kernels();
  if (!kernels.empty()) log.info("OpenBLAS kernels: {}", kernels);
  const std::string hint = openblas_kernel_hint();
  if (!hint.empty()) log.info("{}", hint);
}

}  // namespace hp
