#include "framework/trainer/throughput.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>

#include "framework/metrics/metrics.h"
#include "hp/model/precision.h"

namespace hp {

double measure_matmul_flops(double budget_seconds, at::ScalarType dtype) {
  // n = 1024: large enough for BLAS to reach its plateau (docs/toolchain.md:
  // 85 GFLOP/s on one core at n = 1024-2048), small enough for ~25 ms a product.
  constexpr std::int64_t n = 1024;
  at::Tensor a = at::rand({n, n}, at::kFloat), b = at::rand({n, n}, at::kFloat);
  if (dtype != at::kFloat) {
    // The product the layers run on this type (its kernel included).
    c10::NoGradGuard no_grad;
    a = a.to(dtype), b = b.to(dtype);
    precision::matmul(a, b);  // warm-up
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    double best = 0;
    for (int i = 0; i < 16; ++i) {
      const auto t0 = Clock::now();
      precision::matmul(a, b);
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (s > 0) best = std::max(best, 2.0 * n * n * n / s);
      if (std::chrono::duration<double>(Clock::now() - start).count() > budget_seconds && i >= 2) break;
    }
    return best;
  }
  at::Tensor c = at::mm(a, b);  // warm-up: threads, BLAS buffers
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  double best = 0;
  for (int i = 0; i < 16; ++i) {
    const auto t0 = Clock::now();
    at::mm_out(c, a, b);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s > 0) best = std::max(best, 2.0 * n * n * n / s);
    if (std::chrono::duration<double>(Clock::now() - start).count() > budget_seconds && i >= 2)
      break;
  }
  return best;
}

Throughput::Throughput(double train_flops_per_token, double peak_per_rank, int world_size,
                       metrics::Registry* registry)
    : per_token_(train_flops_per_token), peak_(peak_per_rank), world_(std::max(1, world_size)) {
  if (!registry) return;
  fps_ = &registry->gauge(
      "hp_model_flops_per_second",
      "Model FLOP/s of the last step, all ranks (training FLOPs per token x tokens / step time).");
  mfu_ = &registry->gauge(
      "hp_mfu", "Model FLOPs utilisation of the last step: model FLOP/s / (peak x world size).");
  registry->gauge("hp_peak_flops", "Peak FLOP/s of one rank that MFU is held against.").set(peak_);
}

double Throughput::flops_per_second(double tokens, double seconds) const {
  return seconds > 0 ? per_token_ * tokens / seconds : 0.0;
}

double Throughput::mfu(double flops_per_second) const {
  return peak_ > 0 ? flops_per_second / (peak_ * world_) : 0.0;
}

void Throughput::on_step(double tokens, double seconds) {
  const double f = flops_per_second(tokens, seconds);
  if (fps_) fps_->set(f);
  if (mfu_) mfu_->set(mfu(f));
}

}  // namespace hp
