#include "framework/model/packed_gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <stdexcept>

#if defined(__x86_64__)
#include <immintrin.h>
#define HP_PACKED_GEMM_X86 1
#define HP_AVX2 __attribute__((target("avx2,fma")))
#define HP_AVX512 __attribute__((target("avx512f,avx2,fma")))
#endif

namespace hp::packed_gemm {

namespace {

/// Products are summed over k in blocks of this many: a block of a panel
/// (16 KiB) and of six rows of x (6 KiB) stay in L1 while a row block runs.
constexpr std::int64_t kBlock = 256;

#ifdef HP_PACKED_GEMM_X86
HP_AVX2 inline void add_to(float* o, __m256 lo, __m256 hi) {
  _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), lo));
  _mm256_storeu_ps(o + 8, _mm256_add_ps(_mm256_loadu_ps(o + 8), hi));
}

/// One row's step: x's element times the panel's 16 columns, into the
/// row's two accumulators (inlined: they stay in registers).
HP_AVX2 __attribute__((always_inline)) inline void fma_row(const float* x, __m256 b0, __m256 b1,
                                                          __m256& lo, __m256& hi) {
  const __m256 a = _mm256_broadcast_ss(x);
  lo = _mm256_fmadd_ps(a, b0, lo);
  hi = _mm256_fmadd_ps(a, b1, hi);
}

/// Where x's element (row, k) is: k apart by 1 (kUnit, the products of
/// rows) or by sk (x read transposed: the weight gradients' a^T).
template <bool kUnit>
inline std::int64_t at_k(std::int64_t k, std::int64_t sk) {
  return kUnit ? k : k * sk;
}

/// R rows (1..6) by one panel of 16 columns over k in [0, K): twelve
/// accumulators (two of 8 columns per row) chained by FMA in k order,
/// then added to out. Each accumulator is its own variable: as an array
/// GCC keeps them in memory and the loop runs at a third of the speed.
template <int R, bool kUnit>
HP_AVX2 void rows_by_panel(const float* x, std::int64_t ldx, std::int64_t sk, const float* p,
                           std::int64_t K, float* out, std::int64_t ldo) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
         c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  const float* x0 = x;
  const float* x1 = x + ldx;
  const float* x2 = x + 2 * ldx;
  const float* x3 = x + 3 * ldx;
  const float* x4 = x + 4 * ldx;
  const float* x5 = x + 5 * ldx;
  for (std::int64_t k = 0; k < K; ++k, p += kPanel) {
    const __m256 b0 = _mm256_loadu_ps(p), b1 = _mm256_loadu_ps(p + 8);
    const std::int64_t xk = at_k<kUnit>(k, sk);
    fma_row(x0 + xk, b0, b1, c00, c01);
    if constexpr (R > 1) fma_row(x1 + xk, b0, b1, c10, c11);
    if constexpr (R > 2) fma_row(x2 + xk, b0, b1, c20, c21);
    if constexpr (R > 3) fma_row(x3 + xk, b0, b1, c30, c31);
    if constexpr (R > 4) fma_row(x4 + xk, b0, b1, c40, c41);
    if constexpr (R > 5) fma_row(x5 + xk, b0, b1, c50, c51);
  }
  add_to(out + 0 * ldo, c00, c01);
  if constexpr (R > 1) add_to(out + 1 * ldo, c10, c11);
  if constexpr (R > 2) add_to(out + 2 * ldo, c20, c21);
  if constexpr (R > 3) add_to(out + 3 * ldo, c30, c31);
  if constexpr (R > 4) add_to(out + 4 * ldo, c40, c41);
  if constexpr (R > 5) add_to(out + 5 * ldo, c50, c51);
}

/// Rows r0..r0+7 of W (row stride ld), columns c0..c0+7: stored as they
/// are into the direct panels (panel c0 / 16, rows r0.., lanes c0 % 16..)
/// and transposed into the transposed ones (panel r0 / 16, rows c0..,
/// lanes r0 % 16..).
HP_AVX2 inline void pack_block(const float* w, std::int64_t ld, std::int64_t R, std::int64_t r0,
                               std::int64_t c0, float* direct, float* transposed) {
  __m256 r[8];
  float* d = direct + (c0 / kPanel) * kPanel * R + r0 * kPanel + c0 % kPanel;
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm256_loadu_ps(w + (r0 + i) * ld + c0);
    _mm256_storeu_ps(d + i * kPanel, r[i]);
  }
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]),
               t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]),
               t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]),
               t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
               u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
               u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
               u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  // Column c0 + j of the block (rows r0..r0+7) is row c0 + j of the
  // transposed operand's panel.
  float* t = transposed + (r0 / kPanel) * kPanel * ld + c0 * kPanel + r0 % kPanel;
  _mm256_storeu_ps(t + 0 * kPanel, _mm256_permute2f128_ps(u0, u4, 0x20));
  _mm256_storeu_ps(t + 1 * kPanel, _mm256_permute2f128_ps(u1, u5, 0x20));
  _mm256_storeu_ps(t + 2 * kPanel, _mm256_permute2f128_ps(u2, u6, 0x20));
  _mm256_storeu_ps(t + 3 * kPanel, _mm256_permute2f128_ps(u3, u7, 0x20));
  _mm256_storeu_ps(t + 4 * kPanel, _mm256_permute2f128_ps(u0, u4, 0x31));
  _mm256_storeu_ps(t + 5 * kPanel, _mm256_permute2f128_ps(u1, u5, 0x31));
  _mm256_storeu_ps(t + 6 * kPanel, _mm256_permute2f128_ps(u2, u6, 0x31));
  _mm256_storeu_ps(t + 7 * kPanel, _mm256_permute2f128_ps(u3, u7, 0x31));
}

HP_AVX2 void pack_both_avx2(const float* w, std::int64_t R, std::int64_t C, float* direct,
                            float* transposed) {
  for (std::int64_t r0 = 0; r0 < R; r0 += 8)
    for (std::int64_t c0 = 0; c0 < C; c0 += 8) pack_block(w, C, R, r0, c0, direct, transposed);
}

/// The AVX-512 block: R rows (1..8) by P panels (1 or 2: 16 or 32
/// columns), one 16-wide accumulator per row and panel (up to 16 of the 32
/// registers), chained by FMA in k order, then added to out: per element
/// the AVX2 kernel's arithmetic. The panels are `pstride` floats apart.
template <int R, int P, bool kUnit>
HP_AVX512 void rows_by_panels(const float* x, std::int64_t ldx, std::int64_t sk, const float* p,
                              std::int64_t pstride, std::int64_t K, float* out, std::int64_t ldo) {
  __m512 c[R][P];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 2
    for (int j = 0; j < P; ++j) c[i][j] = _mm512_setzero_ps();
  for (std::int64_t k = 0; k < K; ++k, p += kPanel) {
    __m512 b[P];
#pragma GCC unroll 2
    for (int j = 0; j < P; ++j) b[j] = _mm512_loadu_ps(p + j * pstride);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m512 a = _mm512_set1_ps(x[i * ldx + at_k<kUnit>(k, sk)]);
#pragma GCC unroll 2
      for (int j = 0; j < P; ++j) c[i][j] = _mm512_fmadd_ps(a, b[j], c[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 2
    for (int j = 0; j < P; ++j) {
      float* o = out + i * ldo + j * kPanel;
      _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), c[i][j]));
    }
}

template <int P, bool kUnit>
HP_AVX512 void rows_by_panels(std::int64_t rows, const float* x, std::int64_t ldx, std::int64_t sk,
                              const float* p, std::int64_t pstride, std::int64_t K, float* out,
                              std::int64_t ldo) {
  switch (rows) {
    case 8: rows_by_panels<8, P, kUnit>(x, ldx, sk, p, pstride, K, out, ldo); break;
    case 7: rows_by_panels<7, P, kUnit>(x, ldx, sk, p, pstride, K, out, ldo); break;
    case 6: rows_by_panels<6, P, kUnit>(x, ldx, sk, p, pstride, K, out, ldo); break;
    case 5: rows_by_panels<5, P, kUnit>(x, ldx, sk, p, pstride, K, out, ldo); break;
    case 4: rows_by_panels<4, P, kUnit>(x, ldx, sk, p, pstride, K, out, ldo); break;
    case 3: rows_by_panels<3, P, kUnit>(x, ldx, sk, p, pstride, K, out, ldo); break;
    case 2: rows_by_panels<2, P, kUnit>(x, ldx, sk, p, pstride, K, out, ldo); break;
    default: rows_by_panels<1, P, kUnit>(x, ldx, sk, p, pstride, K, out, ldo); break;
  }
}

/// The blocking both kernels share: k in blocks of kBlock (each block's
/// sums added to out in block order), columns `step_panels` panels at a
/// time (fewer at the end), rows `step_rows` at a time; `block(rows,
/// panels, x, p, kb, out)` runs one block: its first row of x, its first
/// panel's k0 row, its k length and its output corner.
template <bool kUnit, class Block>
void for_blocks(std::int64_t m, std::int64_t K, std::int64_t N, const float* x, std::int64_t ldx,
                std::int64_t sk, const float* panels, float* out, std::int64_t ldo,
                std::int64_t step_rows, std::int64_t step_panels, const Block& block) {
  for (std::int64_t k0 = 0; k0 < K; k0 += kBlock) {
    const std::int64_t kb = std::min(kBlock, K - k0);
    for (std::int64_t n0 = 0; n0 < N; n0 += step_panels * kPanel) {
      const float* p = panels + n0 * K + k0 * kPanel;
      const std::int64_t np = std::min(step_panels, (N - n0) / kPanel);
      for (std::int64_t i = 0; i < m; i += step_rows)
        block(std::min(step_rows, m - i), np, x + i * ldx + at_k<kUnit>(k0, sk), p, kb, out + i * ldo + n0);
    }
  }
}

/// The AVX-512 product: two panels at a time (the last one alone when N /
/// 16 is odd), rows eight at a time.
template <bool kUnit>
void product_avx512(std::int64_t m, std::int64_t K, std::int64_t N, const float* x, std::int64_t ldx,
                    std::int64_t sk, const float* panels, float* out, std::int64_t ldo) {
  for_blocks<kUnit>(m, K, N, x, ldx, sk, panels, out, ldo, 8, 2,
                    [&](std::int64_t r, std::int64_t np, const float* xi, const float* p, std::int64_t kb, float* o) {
                      if (np == 2)
                        rows_by_panels<2, kUnit>(r, xi, ldx, sk, p, kPanel * K, kb, o, ldo);
                      else
                        rows_by_panels<1, kUnit>(r, xi, ldx, sk, p, kPanel * K, kb, o, ldo);
                    });
}

template <bool kUnit>
HP_AVX2 void rows_by_panel(std::int64_t rows, const float* x, std::int64_t ldx, std::int64_t sk,
                           const float* p, std::int64_t K, float* out, std::int64_t ldo) {
  switch (rows) {
    case 6: rows_by_panel<6, kUnit>(x, ldx, sk, p, K, out, ldo); break;
    case 5: rows_by_panel<5, kUnit>(x, ldx, sk, p, K, out, ldo); break;
    case 4: rows_by_panel<4, kUnit>(x, ldx, sk, p, K, out, ldo); break;
    case 3: rows_by_panel<3, kUnit>(x, ldx, sk, p, K, out, ldo); break;
    case 2: rows_by_panel<2, kUnit>(x, ldx, sk, p, K, out, ldo); break;
    default: rows_by_panel<1, kUnit>(x, ldx, sk, p, K, out, ldo); break;
  }
}

/// The AVX2 product: one panel at a time, rows six at a time.
template <bool kUnit>
void product_avx2(std::int64_t m, std::int64_t K, std::int64_t N, const float* x, std::int64_t ldx,
                  std::int64_t sk, const float* panels, float* out, std::int64_t ldo) {
  for_blocks<kUnit>(m, K, N, x, ldx, sk, panels, out, ldo, 6, 1,
                    [&](std::int64_t r, std::int64_t, const float* xi, const float* p, std::int64_t kb, float* o) {
                      rows_by_panel<kUnit>(r, xi, ldx, sk, p, kb, o, ldo);
                    });
}
#endif

void require(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("packed_gemm: ") + what);
}

}  // namespace

bool supported() {
#ifdef HP_PACKED_GEMM_X86
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
#else
  return false;
#endif
}

bool supports_avx512() {
#ifdef HP_PACKED_GEMM_X86
  static const bool ok = supported() && __builtin_cpu_supports("avx512f");
  return ok;
#else
  return false;
#endif
}

namespace {

Kernel choose_kernel() {
  const char* env = std::getenv("HP_PACKED_GEMM_KERNEL");
  const std::string v = env ? env : "";
  if (v.empty()) return supports_avx512() ? Kernel::kAvx512 : Kernel::kAvx2;
  if (v == "avx2") return Kernel::kAvx2;
  if (v == "avx512") {
    if (!supports_avx512())
      throw std::invalid_argument(
          "HP_PACKED_GEMM_KERNEL=avx512: this CPU lacks AVX-512F; unset it or set avx2 (legal: avx2, avx512)");
    return Kernel::kAvx512;
  }
  throw std::invalid_argument("HP_PACKED_GEMM_KERNEL='" + v +
                              "' is not a packed expert kernel (legal: avx2, avx512; unset: the CPU's best)");
}

}  // namespace

Kernel best_kernel() {
  static const Kernel k = choose_kernel();
  return k;
}

std::string describe_best_kernel() {
  if (!supported()) return "none (no AVX2 + FMA: the experts run through BLAS)";
  const char* env = std::getenv("HP_PACKED_GEMM_KERNEL");
  const std::string name = best_kernel() == Kernel::kAvx512 ? "AVX-512" : "AVX2";
  if (env && *env) return name + " (HP_PACKED_GEMM_KERNEL=" + env + ")";
  return name + " (the CPU's best; HP_PACKED_GEMM_KERNEL unset)";
}

void pack(const float* b, std::int64_t K, std::int64_t N, std::int64_t sk, std::int64_t sn,
          float* panels) {
  require(N % kPanel == 0, "N must be a multiple of 16, please report");
  for (std::int64_t n0 = 0; n0 < N; n0 += kPanel) {
    float* p = panels + n0 * K;
    if (sn == 1) {
      for (std::int64_t k = 0; k < K; ++k) std::memcpy(p + k * kPanel, b + k * sk + n0, sizeof(float) * kPanel);
    } else {
      // Column n of the panel is a strided row of b: read each one along k.
      for (std::int64_t j = 0; j < kPanel; ++j) {
        const float* src = b + (n0 + j) * sn;
        for (std::int64_t k = 0; k < K; ++k) p[k * kPanel + j] = src[k * sk];
      }
    }
  }
}

void pack_both(const float* w, std::int64_t R, std::int64_t C, float* direct, float* transposed) {
  require(R % kPanel == 0 && C % kPanel == 0, "both sides must be multiples of 16, please report");
#ifdef HP_PACKED_GEMM_X86
  if (supported()) {
    pack_both_avx2(w, R, C, direct, transposed);
    return;
  }
#endif
  pack(w, R, C, C, 1, direct);
  pack(w, C, R, 1, C, transposed);
}

void product_add(std::int64_t m, std::int64_t K, std::int64_t N, const float* x, std::int64_t ldx,
                 std::int64_t sk, const float* panels, float* out, std::int64_t ldo, Kernel kernel) {
  require(N % kPanel == 0, "N must be a multiple of 16, please report");
  require(supported(), "this CPU lacks AVX2 or FMA, please report");
  if (kernel == Kernel::kBest) kernel = best_kernel();
  require(kernel != Kernel::kAvx512 || supports_avx512(), "this CPU lacks AVX-512F for the kAvx512 kernel");
#ifdef HP_PACKED_GEMM_X86
  if (kernel == Kernel::kAvx512) {
    if (sk == 1)
      product_avx512<true>(m, K, N, x, ldx, 1, panels, out, ldo);
    else
      product_avx512<false>(m, K, N, x, ldx, sk, panels, out, ldo);
  } else if (sk == 1) {
    product_avx2<true>(m, K, N, x, ldx, 1, panels, out, ldo);
  } else {
    product_avx2<false>(m, K, N, x, ldx, sk, panels, out, ldo);
  }
#endif
}

void product(std::int64_t m, std::int64_t K, std::int64_t N, const float* x, std::int64_t ldx,
             const float* panels, const float* bias, float* out, std::int64_t ldo, Kernel kernel) {
  require(N % kPanel == 0, "N must be a multiple of 16, please report");
  for (std::int64_t i = 0; i < m; ++i) {
    if (bias)
      std::memcpy(out + i * ldo, bias, sizeof(float) * static_cast<std::size_t>(N));
    else
      std::fill(out + i * ldo, out + i * ldo + N, 0.0f);
  }
  product_add(m, K, N, x, ldx, 1, panels, out, ldo, kernel);
}

}  // namespace hp::packed_gemm
