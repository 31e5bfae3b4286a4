#pragma once
// Debian's LibTorch calls whatever libblas.so.3 the alternatives system
// points at; the netlib reference BLAS makes training ~20x slower.
#include <spdlog/logger.h>

#include <string>

namespace hp {

/// The BLAS library this process has mapped ("" if none found yet).
std::string loaded_blas();
/// Debian's LibTorch uses its own thread pool, but OpenBLAS (OpenMP build)
/// sizes its pool from OpenMP, so at::set_num_threads alone leaves BLAS on
/// every core. Sets both to `n`; returns false if no BLAS thread control was
/// found (reference BLAS is single-threaded anyway).
bool set_blas_threads(int n);

/// Logs a warning naming the fix when the reference BLAS is in use.
void warn_if_reference_blas(spdlog::logger& log);

/// OpenBLAS's kernel family in this process (openblas_get_corename():
/// "Haswell", "Zen", "SkylakeX", ...); "" when OpenBLAS is not loaded.
std::string openblas_core();

/// Which OpenBLAS kernels run and who chose them: "SkylakeX (detected by
/// OpenBLAS; OPENBLAS_CORETYPE unset)" or "Haswell (OPENBLAS_CORETYPE=
/// Haswell)"; "" when OpenBLAS is not loaded. Unset, OpenBLAS picks by the
/// CPU it detects: with Debian's 0.3.21, seen Cooperlake on an AMD EPYC with
/// AVX512_BF16 and SkylakeX on an Intel Xeon with AVX512_BF16 (its model
/// tables, not the feature flags, decide; docs/toolchain.md, section 4).
std::string openblas_kernels();

/// One line for a user when OpenBLAS runs its AVX2 kernels (Haswell, Zen)
/// on a CPU with AVX-512F and OPENBLAS_CORETYPE is not set: Debian's
/// OpenBLAS 0.3.21 does so on CPUs newer than it, at about 0.6 x the
/// speed of its AVX-512 kernels (docs/toolchain.md, section 4). "" when
/// there is nothing to say.
std::string openblas_kernel_hint();

/// Logs which OpenBLAS kernels run (openblas_kernels()) and
/// openblas_kernel_hint() when it says something, at info.
void note_openblas_kernels(spdlog::logger& log);

}  // namespace hp
