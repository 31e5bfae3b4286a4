#include "framework/optim/adam_kernel.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace hp {

namespace {

// The same roundings as the chain of tensor operations it replaces, so the
// numbers do not change, bitwise: LibTorch's CPU kernels for a machine
// with AVX2 are compiled with FMA and contraction, so its `add_(g, alpha)`
// is fma(alpha, g, self), `addcmul_(g, g, c)` fma(c * g, g, self), while
// `addcdiv_(m, d, s)` is self + (s * m) / d (a division is never fused);
// the kernels of a machine without AVX2 round every product and sum on
// their own. This file is built with -ffp-contract=off so the compiler
// fuses nothing by itself: every fma below is written out.
template <bool kFma, bool kL2>
inline void adam_element(const AdamScalars& s, float& p, float g, float& m, float& v) {
  const float pd = p * s.decay;
  float gi = g;
  if (kL2) gi = kFma ? std::fma(p, s.l2, g) : g + p * s.l2;
  const float m1 = m * s.beta1, v1 = v * s.beta2, cg = s.one_minus_beta2 * gi;
  const float mi = kFma ? std::fma(s.one_minus_beta1, gi, m1) : m1 + s.one_minus_beta1 * gi;
  const float vi = kFma ? std::fma(cg, gi, v1) : v1 + cg * gi;
  m = mi;
  v = vi;
  const float denom = std::sqrt(vi) / s.sqrt_bc2 + s.eps;
  p = pd + (s.step * mi) / denom;
}

template <bool kL2>
__attribute__((target("avx2,fma"))) void range_fma(const AdamScalars& s, std::int64_t n, float* __restrict p,
                                                   const float* __restrict g, float* __restrict m,
                                                   float* __restrict v) {
  for (std::int64_t i = 0; i < n; ++i) adam_element<true, kL2>(s, p[i], g[i], m[i], v[i]);
}

template <bool kL2>
void range_plain(const AdamScalars& s, std::int64_t n, float* __restrict p, const float* __restrict g,
                 float* __restrict m, float* __restrict v) {
  for (std::int64_t i = 0; i < n; ++i) adam_element<false, kL2>(s, p[i], g[i], m[i], v[i]);
}

constexpr std::int64_t kChunk = std::int64_t{1} << 15;

/// Whether LibTorch runs its AVX2 (or AVX-512) kernels, decided as it does
/// (its own function is not exported): ATEN_CPU_CAPABILITY when set to
/// default, avx2 or avx512; else the CPU's AVX2 and FMA.
bool torch_kernels_fuse() {
  static const bool fuse = [] {
    const char* env = std::getenv("ATEN_CPU_CAPABILITY");
    if (env && std::strcmp(env, "default") == 0) return false;
    if (env && (std::strcmp(env, "avx2") == 0 || std::strcmp(env, "avx512") == 0)) return true;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return fuse;
}

}  // namespace

void adam_fused(const AdamScalars& s, std::int64_t n, float* p, const float* g, float* m, float* v) {
  const bool fma = torch_kernels_fuse();
  const bool l2 = s.l2 != 0.0f;
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
  at::parallel_for(0, chunks, 1, [&](std::int64_t b, std::int64_t e) {
    const std::int64_t lo = b * kChunk, len = std::min(n, e * kChunk) - lo;
    if (fma && l2) range_fma<true>(s, len, p + lo, g + lo, m + lo, v + lo);
    else if (fma) range_fma<false>(s, len, p + lo, g + lo, m + lo, v + lo);
    else if (l2) range_plain<true>(s, len, p + lo, g + lo, m + lo, v + lo);
    else range_plain<false>(s, len, p + lo, g + lo, m + lo, v + lo);
  });
}

}  // namespace hp
