#include "framework/optim/sum_squares.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace hp {

namespace {

constexpr std::int64_t kChunk = std::int64_t{1} << 16;

double chunk_sum(const float* p, std::int64_t n) {
  // Eight independent running sums: the adds of one do not wait for the
  // others' (a single sum is bound by the add latency), in a fixed order.
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) {
      const double v = p[i + j];
      s[j] += v * v;
    }
  }
  for (int j = 0; i < n; ++i, ++j) {
    const double v = p[i];
    s[j] += v * v;
  }
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

}  // namespace

double sum_of_squares(const at::Tensor& x) {
  if (x.scalar_type() != at::kFloat) return x.to(at::kDouble).pow(2).sum().item<double>();
  const at::Tensor c = x.contiguous();
  const float* p = c.data_ptr<float>();
  const std::int64_t n = c.numel(), chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> part(static_cast<std::size_t>(chunks), 0.0);
  at::parallel_for(0, chunks, 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t k = b; k < e; ++k) {
      part[static_cast<std::size_t>(k)] = chunk_sum(p + k * kChunk, std::min(kChunk, n - k * kChunk));
    }
  });
  double total = 0;
  for (double v : part) total += v;
  return total;
}

}  // namespace hp
