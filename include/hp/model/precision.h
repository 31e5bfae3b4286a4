#pragma once
// Compute precision. Parameters (the masters), their gradients and the
// optimizer's state are fp32 always; a precision policy (set by the
// mixed_precision feature, docs/rfc/0014-mixed-precision.md) names the type
// of the compute copies and of the activations between layers, and the type
// gradients are summed in across ranks.
//
// Layers follow the type of their input: the embedding starts the stream in
// the policy's type, and every layer below casts its fp32 weights to its
// input's type as it uses them (a differentiable cast: the weight's gradient
// arrives in fp32). With the fp32 policy every cast is a no-op and every
// product is ATen's own, bitwise what it was before the policy existed.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace hp {

struct PrecisionPolicy {
  /// Compute copies of the weights and the activations between layers.
  at::ScalarType param_dtype = at::kFloat;
  /// Gradient sums across ranks (the result is fp32 again).
  at::ScalarType reduce_dtype = at::kFloat;
  bool mixed() const { return param_dtype != at::kFloat; }
};

/// "fp32", "bf16".
std::string dtype_name(at::ScalarType t);

namespace precision {

/// How a product of bf16 operands runs.
///  kNative: ATen's bf16 product (oneDNN on a CPU with AVX-512 BW/VL/DQ,
///           bf16 instructions where it has AVX512_BF16; ATen's reference
///           loop elsewhere, slow).
///  kWiden:  the bf16 operands widened to fp32 and multiplied by the fp32
///           BLAS, the result rounded to bf16: the same inputs and outputs
///           with fp32 accumulation, at fp32 speed (for CPUs without
///           AVX512_BF16, where the native path is the slower).
enum class ProductKernel { kNative, kWiden };
/// Process-wide, set once at start-up by the mixed_precision feature.
void set_product_kernel(ProductKernel k);
ProductKernel product_kernel();
/// Whether this CPU has AVX512_BF16 (then kNative runs bf16 instructions).
bool cpu_has_avx512_bf16();
const char* to_string(ProductKernel k);

/// `t` as type `dtype`, differentiably (the gradient comes back in t's
/// type); `t` itself when it has that type already.
at::Tensor cast(const at::Tensor& t, at::ScalarType dtype);

/// x W^T + b in x's type: W and b (fp32 masters, or already x's type) are
/// cast to it. fp32 x: at::linear itself. bf16 x: a product with fp32
/// accumulation rounded to bf16, by product_kernel(); the gradient of x is
/// bf16, those of W and b come back in their own types.
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b = {});

/// a @ b (batched over equal leading dimensions) in a's type, by the same
/// rule as linear (b cast to a's type).
at::Tensor matmul(const at::Tensor& a, const at::Tensor& b);

/// Layer norm over the last dimension (`dim` features) of x with fp32
/// weight and bias: x itself through at::layer_norm for fp32; for bf16 x
/// the statistics and the affine in fp32, the result in bf16, and backward
/// from the bf16 input saved (not an fp32 copy), the same bits as
/// at::layer_norm on x widened.
at::Tensor layer_norm(const at::Tensor& x, std::int64_t dim, const at::Tensor& w, const at::Tensor& b, double eps);

/// softmax(s, -1) of fp32 scores as type `dtype`: at::softmax for fp32; for
/// bf16 the softmax in fp32, the probabilities returned and saved in bf16
/// (backward in fp32 from them), so attention keeps one bf16 copy of them.
at::Tensor softmax_as(const at::Tensor& s, at::ScalarType dtype);

/// An fp32 statistic of `x` computed as `f(x in fp32)` and returned in x's
/// type (normalisation, softmax): x itself for fp32.
template <typename F>
at::Tensor in_fp32(const at::Tensor& x, F&& f) {
  if (x.scalar_type() == at::kFloat) return f(x);
  return f(cast(x, at::kFloat)).to(x.scalar_type());
}

}  // namespace precision
}  // namespace hp
