#pragma once
// hp-compare's gradient part: reads the gradient dumps of one step
// (grads_step<N>/grads-rank*.safetensors, written by every rank with each
// slice's placement, see framework/trainer/grad_dump.h), assembles each
// gradient from its slices, checks the dump itself (slices tile the global
// shape, the copies of a replicate group are bitwise equal, nothing is NaN
// or infinite) and compares the assembled gradients with the reference's.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hp::compare {

struct GradOptions {
  std::int64_t step = 0;
  double rtol = 1e-5;
  /// Bars of their own for the gradients whose names contain a pattern
  /// (the first pattern that matches wins), e.g. {"router.weight", 1e-1}.
  std::vector<std::pair<std::string, double>> bars;
  double bar_for(const std::string& name) const {
    for (const auto& [pattern, bar] : bars) {
      if (name.find(pattern) != std::string::npos) return bar;
    }
    return rtol;
  }
};

/// Prints what it checked and every failure; returns 0 when every check
/// and bar holds, 1 otherwise. Throws std::runtime_error on unreadable input.
int compare_grads(const std::string& ref_dir, const std::string& run_dir, const GradOptions& o);

}  // namespace hp::compare
