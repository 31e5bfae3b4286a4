#pragma once
// Debian's LibTorch calls whatever libblas.so.3 the alternatives system
// points at; the netlib reference BLAS makes training ~20x slower.
#include <spdlog/logger.h>

#include <string>

namespace hp {

/// The BLAS library this process has mapped ("" if none found yet).
std::string loaded_blas();
/// Logs a warning naming the fix when the reference BLAS is in use.
void warn_if_reference_blas(spdlog::logger& log);

}  // namespace hp
