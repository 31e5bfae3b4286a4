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

}  // namespace hp
