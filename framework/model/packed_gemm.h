#pragma once
// A small-row fp32 matrix product on weights packed once: what the experts
// of a mixture-of-experts layer need. An expert sees a few dozen rows per
// micro-batch (top_k / experts of the tokens), and a BLAS call packs the
// expert's whole weight again for each of them; packing once per optimizer
// step and reusing the panels across micro-batches and the backward leaves
// only the arithmetic (RFC 0008, "Packed expert weights").
//
// x86-64 with AVX2 and FMA, checked at run time; elsewhere supported()
// is false and callers use BLAS. Where the CPU has AVX-512F the product
// runs 16-wide with 8 rows by 32 columns of accumulators (twice the AVX2
// kernel's rate on a full-width AVX-512 core, measured by
// bench/bench_packed_gemm.cpp), bit for bit the AVX2 kernel's result:
// every output element is the same chain of FMAs in the same order. No
// LibTorch here: plain float pointers.
#include <cstdint>
#include <string>

namespace hp::packed_gemm {

/// Output columns per panel.
inline constexpr std::int64_t kPanel = 16;

/// Whether this CPU runs the kernel (AVX2 and FMA).
bool supported();

/// The instruction set product() runs on: kBest is best_kernel() (kAvx512
/// where the CPU has AVX-512F, else kAvx2, unless HP_PACKED_GEMM_KERNEL
/// says otherwise). The two give the same bits; choosing one is for tests
/// and benchmarks.
enum class Kernel { kBest, kAvx2, kAvx512 };

/// Whether this CPU runs the AVX-512 kernel (AVX-512F, besides AVX2 and FMA).
bool supports_avx512();

/// The kernel kBest stands for: the CPU's best (kAvx512 where it has
/// AVX-512F, else kAvx2), or the one the environment variable
/// HP_PACKED_GEMM_KERNEL names (`avx2` or `avx512`), so that one AVX-512
/// machine runs the layouts' parity tests on both. The weight gradients of
/// the experts go through packed_gemm only when it is kAvx512 (BLAS else).
/// Throws std::invalid_argument for another value, or `avx512` on a CPU
/// without AVX-512F, naming the variable and the legal values.
Kernel best_kernel();
/// "AVX-512 (the CPU's best; HP_PACKED_GEMM_KERNEL unset)", for logs and dumps.
std::string describe_best_kernel();

/// Floats a packed [K, N] operand takes (N a multiple of kPanel).
inline std::int64_t packed_size(std::int64_t K, std::int64_t N) { return K * N; }

/// Packs B [K, N], element (k, n) at b[k * sk + n * sn], into N / kPanel
/// panels of [K, kPanel] (k-major), the layout product() reads. N must be
/// a multiple of kPanel.
void pack(const float* b, std::int64_t K, std::int64_t N, std::int64_t sk, std::int64_t sn,
          float* panels);

/// Packs both operands a weight W [R, C] (row-major) serves in one pass
/// over it: `direct` as pack(w, R, C, C, 1) (B = W) and `transposed` as
/// pack(w, C, R, 1, C) (B = W^T), the same panels bit for bit. Reads W
/// once (8 x 8 blocks, each stored as it is and transposed) where two
/// pack() calls read it twice, the transposed one element by element. R
/// and C must be multiples of kPanel.
void pack_both(const float* w, std::int64_t R, std::int64_t C, float* direct, float* transposed);

/// out[i, :] = (bias, or 0 when bias is null) + x[i, :] B for i < m: x
/// [m, K] with row stride ldx, B packed by pack(), out [m, N] with row
/// stride ldo. Sums over k in blocks of 256, each block's products chained
/// by FMA in k order and added to out in block order: deterministic, but
/// not BLAS's rounding. The same bits whichever kernel runs it.
void product(std::int64_t m, std::int64_t K, std::int64_t N, const float* x, std::int64_t ldx,
             const float* panels, const float* bias, float* out, std::int64_t ldo,
             Kernel kernel = Kernel::kBest);

/// out[i, :] += x's row i times B for i < m, adding to what out holds (no
/// bias, no fill): per k block (256) the products chained by FMA in k
/// order, then added to out, as product() does after its fill. x's element
/// (i, k) is at x[i * ldx + k * sk]: sk = 1 for rows, ldx = 1 and sk = the
/// row stride for a matrix read transposed (the weight gradients a^T b,
/// a [K, m] row-major). N must be a multiple of kPanel.
void product_add(std::int64_t m, std::int64_t K, std::int64_t N, const float* x, std::int64_t ldx,
                 std::int64_t sk, const float* panels, float* out, std::int64_t ldo,
                 Kernel kernel = Kernel::kBest);

}  // namespace hp::packed_gemm
