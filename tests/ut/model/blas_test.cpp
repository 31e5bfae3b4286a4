// What the trainer says at start-up about the BLAS LibTorch calls: the
// OpenBLAS kernel family is read from the library itself and said with who
// chose it (OpenBLAS's detection, or OPENBLAS_CORETYPE), and the hint to
// select OpenBLAS's AVX-512 kernels appears exactly when its AVX2 kernels
// run on a CPU with AVX-512F and OPENBLAS_CORETYPE is not set. The test
// reads the texts with the variable unset and set, and puts back what the
// machine had (the only test that touches it: the kernels were chosen when
// the library loaded, so only the texts change).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>

#include "framework/util/blas_check.h"

TEST(BlasCheck, OpenBlasKernelFamilyAndHint) {
  torch::mm(torch::ones({4, 4}), torch::ones({4, 4}));  // BLAS loaded and used
  const std::string blas = hp::loaded_blas();
  const std::string core = hp::openblas_core();
  if (blas.find("openblas") == std::string::npos) {
    EXPECT_EQ(core, "") << "no OpenBLAS mapped (" << blas << ") but a core name";
    EXPECT_EQ(hp::openblas_kernel_hint(), "");
    EXPECT_EQ(hp::openblas_kernels(), "");
    return;
  }
  ASSERT_FALSE(core.empty()) << "OpenBLAS is mapped (" << blas << ") but openblas_get_corename gave nothing";
  // The hint reads OPENBLAS_CORETYPE when asked (the kernels were chosen
  // when the library loaded): without it, then with it.
  const char* set = std::getenv("OPENBLAS_CORETYPE");
  const std::string saved = set ? set : "";
  unsetenv("OPENBLAS_CORETYPE");
  const bool avx2_core = core == "Haswell" || core == "Zen";
#if defined(__x86_64__)
  const bool avx512 = __builtin_cpu_supports("avx512f");
#else
  const bool avx512 = false;
#endif
  const bool expect_hint = avx2_core && avx512;
  const std::string hint = hp::openblas_kernel_hint();
  EXPECT_EQ(!hint.empty(), expect_hint) << "core " << core << ", hint: " << hint;
  EXPECT_EQ(hp::openblas_kernels(), core + " (detected by OpenBLAS; OPENBLAS_CORETYPE unset)");
  if (expect_hint) {
    EXPECT_NE(hint.find("OPENBLAS_CORETYPE=SKYLAKEX"), std::string::npos) << hint;
    EXPECT_NE(hint.find(core), std::string::npos) << hint;
  }
  // Once the user chose a core type, nothing more to say.
  setenv("OPENBLAS_CORETYPE", "HASWELL", 1);
  EXPECT_EQ(hp::openblas_kernel_hint(), "");
  EXPECT_EQ(hp::openblas_kernels(), core + " (OPENBLAS_CORETYPE=HASWELL)");
  if (saved.empty())
    unsetenv("OPENBLAS_CORETYPE");
  else
    setenv("OPENBLAS_CORETYPE", saved.c_str(), 1);
}
