// The experts' packed product (framework/model/packed_gemm) on its two
// kernels beside BLAS (at::mm, what the dense FFN runs: OpenBLAS under
// Debian's LibTorch), one thread, at the expert shapes of bench_moe.sh
// (hidden 256, expert FFN 1024: x W1^T is K 256 -> N 1024, h W2^T is
// K 1024 -> N 256) and the dense FFN's (N 2048), at 64 to 512 rows.
// Figures are printed, never asserted: GFLOP/s of the best of 30 timed
// calls each (this machine's noise only slows a call down), and whether
// the two kernels gave the same bits.
//   build/bin/hp-bench-packed-gemm
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "framework/model/packed_gemm.h"

namespace pg = hp::packed_gemm;

namespace {

template <class F>
double best_seconds(const F& f) {
  double best = 1e30;
  for (int r = 0; r < 30; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main() {
  at::set_num_threads(1);
  if (!pg::supported()) {
    std::printf("this CPU lacks AVX2 or FMA: the packed product does not run here\n");
    return 0;
  }
  const bool avx512 = pg::supports_avx512();
  std::printf("one thread; GFLOP/s (best of 30); AVX-512F on this CPU: %s\n", avx512 ? "yes" : "no");
  std::printf("%5s %5s %5s %10s %10s %10s %10s\n", "rows", "K", "N", "BLAS", "AVX2", "AVX-512", "same bits");
  at::manual_seed(1);
  const std::int64_t shapes[][2] = {{256, 1024}, {1024, 256}, {256, 2048}, {2048, 256}};
  for (const auto& s : shapes) {
    const std::int64_t K = s[0], N = s[1];
    for (std::int64_t m : {64, 128, 256, 512}) {
      at::Tensor x = at::randn({m, K}), w = at::randn({N, K});  // w as nn.Linear stores it: [out, in]
      at::Tensor wt = w.t(), blas_out = at::empty({m, N});
      std::vector<float> panels(static_cast<std::size_t>(pg::packed_size(K, N)));
      pg::pack(w.data_ptr<float>(), K, N, 1, K, panels.data());  // B = W^T
      std::vector<float> o2(static_cast<std::size_t>(m * N)), o5 = o2;
      const double flop = 2.0 * static_cast<double>(m * K * N);
      const double tb = best_seconds([&] { at::mm_out(blas_out, x, wt); });
      const float* X = x.data_ptr<float>();
      const double t2 = best_seconds(
          [&] { pg::product(m, K, N, X, K, panels.data(), nullptr, o2.data(), N, pg::Kernel::kAvx2); });
      double t5 = 0;
      bool same = true;
      if (avx512) {
        t5 = best_seconds(
            [&] { pg::product(m, K, N, X, K, panels.data(), nullptr, o5.data(), N, pg::Kernel::kAvx512); });
        same = std::memcmp(o2.data(), o5.data(), sizeof(float) * o2.size()) == 0;
      }
      std::printf("%5ld %5ld %5ld %10.1f %10.1f %10s %10s\n", static_cast<long>(m), static_cast<long>(K),
                  static_cast<long>(N), flop / tb / 1e9, flop / t2 / 1e9,
                  avx512 ? std::to_string(flop / t5 / 1e9).substr(0, 5).c_str() : "-",
                  avx512 ? (same ? "yes" : "NO") : "-");
    }
  }
  std::printf("weight gradients a^T b: a [rows, R], b [rows, C]\n");
  std::printf("%5s %5s %5s %10s %10s %10s %10s\n", "rows", "R", "C", "BLAS", "AVX2", "AVX-512", "same bits");
  const std::int64_t grads[][2] = {{256, 1024}, {1024, 256}};
  for (const auto& s : grads) {
    const std::int64_t R = s[0], C = s[1];
    for (std::int64_t m : {64, 128, 256, 512}) {
      at::Tensor a = at::randn({m, R}), b = at::randn({m, C}), at_ = a.t(), blas_out = at::empty({R, C});
      std::vector<float> panels(static_cast<std::size_t>(pg::packed_size(m, C)));
      std::vector<float> o2(static_cast<std::size_t>(R * C)), o5 = o2;
      const double flop = 2.0 * static_cast<double>(m * R * C);
      const double tb = best_seconds([&] { at::mm_out(blas_out, at_, b); });
      auto packed = [&](std::vector<float>& o, pg::Kernel k) {
        std::fill(o.begin(), o.end(), 0.0f);
        pg::pack(b.data_ptr<float>(), m, C, C, 1, panels.data());
        pg::product_add(R, m, C, a.data_ptr<float>(), 1, R, panels.data(), o.data(), C, k);
      };
      const double t2 = best_seconds([&] { packed(o2, pg::Kernel::kAvx2); });
      double t5 = 0;
      bool same = true;
      if (avx512) {
        t5 = best_seconds([&] { packed(o5, pg::Kernel::kAvx512); });
        same = std::memcmp(o2.data(), o5.data(), sizeof(float) * o2.size()) == 0;
      }
      std::printf("%5ld %5ld %5ld %10.1f %10.1f %10s %10s\n", static_cast<long>(m), static_cast<long>(R),
                  static_cast<long>(C), flop / tb / 1e9, flop / t2 / 1e9,
                  avx512 ? std::to_string(flop / t5 / 1e9).substr(0, 5).c_str() : "-",
                  avx512 ? (same ? "yes" : "NO") : "-");
    }
  }
  return 0;
}
