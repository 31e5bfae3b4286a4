#pragma once
// Throughput in model FLOPs and MFU. Model FLOP/s of a step = the model's
// training FLOPs per token (ModelInfo::train_flops_per_token) x the step's
// global tokens / its wall time; MFU = that / (peak FLOP/s of one rank x
// world size). The peak is metrics.peak_flops, or measured at start-up.
#include <c10/core/ScalarType.h>

#include <cstdint>

namespace hp {

namespace metrics {
class Registry;
class Gauge;
}  // namespace metrics

/// The best matmul FLOP/s this process reaches with its current intra-op
/// threads, from a few square matmuls within about `budget_seconds` (one
/// warm-up first), of operands of type `dtype`: fp32 through ATen, bf16
/// through the mixed-precision product (include/hp/model/precision.h, the
/// kernel set for the run). Every rank probes at once, so ranks sharing a
/// machine measure the share they will train with.
double measure_matmul_flops(double budget_seconds = 0.15, at::ScalarType dtype = at::kFloat);

class Throughput {
 public:
  /// `peak_per_rank` > 0; `registry` may be null.
  Throughput(double train_flops_per_token, double peak_per_rank, int world_size,
             metrics::Registry* registry);
  /// Model FLOP/s of the whole job for a step of `tokens` global tokens.
  double flops_per_second(double tokens, double seconds) const;
  /// `flops_per_second` over the job's peak (peak_per_rank x world size).
  double mfu(double flops_per_second) const;
  /// Sets hp_model_flops_per_second and hp_mfu for the last step.
  void on_step(double tokens, double seconds);
  double train_flops_per_token() const { return per_token_; }
  double peak_per_rank() const { return peak_; }

 private:
  double per_token_, peak_;
  int world_;
  metrics::Gauge *fps_ = nullptr, *mfu_ = nullptr;
};

}  // namespace hp
