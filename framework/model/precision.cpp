#include "hp/model/precision.h"

#include "hp/model/weight_grad.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <atomic>
#include <stdexcept>

namespace hp {

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "fp32";
    case at::kBFloat16: return "bf16";
    case at::kHalf: return "fp16";
    case at::kDouble: return "fp64";
    default: return c10::toString(t);
  }
}

namespace precision {

namespace {

std::atomic<ProductKernel> g_kernel{ProductKernel::kNative};

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor widen(const at::Tensor& t) { return t.to(at::kFloat); }

/// `t` as the fp32 values of its bf16 rounding: a bf16 tensor widened, an
/// fp32 one (a master weight) rounded to bf16 and widened.
at::Tensor rounded_widen(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat ? t.to(at::kBFloat16).to(at::kFloat) : widen(t);
}

/// x W^T + b with bf16 x through the fp32 BLAS. W and b are used at their
/// bf16 rounding; an fp32 master is passed as it is and saved as itself (no
/// bf16 copy of the weights held for backward), rounded again there. Saves
/// x in bf16, not a widened copy, so the activation memory stays bf16.
struct WidenLinear : torch::autograd::Function<WidenLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    // No bias: an empty tensor stands for it (LibTorch 1.13's custom
    // functions take no undefined inputs).
    const bool bias = b.numel() > 0;
    ctx->save_for_backward({x, w});
    ctx->saved_data["bias"] = bias;
    return at::linear(widen(x), rounded_widen(w), bias ? rounded_widen(b) : at::Tensor()).to(x.scalar_type());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1];
    const at::Tensor gy = widen(grads[0]);
    const std::int64_t out = w.size(0), in = w.size(1);
    at::Tensor gx, gw, gb;
    if (ctx->needs_input_grad(0)) gx = at::matmul(gy, rounded_widen(w)).to(x.scalar_type());
    const at::Tensor gy2 = gy.reshape({-1, out});
    // The weight's and bias's gradients rounded to bf16 as a bf16 product's
    // are (the native kernel's), then in the type they came in.
    if (ctx->needs_input_grad(1)) {
      gw = gy2.t().mm(widen(x).reshape({-1, in})).to(at::kBFloat16).to(w.scalar_type());
    }
    if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2)) {
      gb = gy2.sum(0).to(at::kBFloat16).to(w.scalar_type());
    }
    return {gx, gw, gb};
  }
};

/// a @ b on bf16 operands of equal leading dimensions through the fp32 BLAS.
struct WidenMatmul : torch::autograd::Function<WidenMatmul> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b) {
    ctx->save_for_backward({a, b});
    return at::matmul(widen(a), widen(b)).to(a.scalar_type());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &a = saved[0], &b = saved[1];
    const at::Tensor gy = widen(grads[0]);
    at::Tensor ga, gb;
    if (ctx->needs_input_grad(0)) ga = at::matmul(gy, widen(b).transpose(-2, -1)).to(a.scalar_type());
    if (ctx->needs_input_grad(1)) gb = at::matmul(widen(a).transpose(-2, -1), gy).to(b.scalar_type());
    return {ga, gb};
  }
};

/// Layer norm of bf16 x in fp32, saving x in bf16 with the fp32 row
/// statistics.
struct NarrowLayerNorm : torch::autograd::Function<NarrowLayerNorm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                            std::int64_t dim, double eps) {
    auto [y, mean, rstd] = at::native_layer_norm(widen(x), {dim}, w, b, eps);
    ctx->save_for_backward({x, w, b, mean, rstd});
    ctx->saved_data["dim"] = dim;
    return y.to(x.scalar_type());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const std::int64_t dim = ctx->saved_data["dim"].toInt();
    auto [gx, gw, gb] = at::native_layer_norm_backward(
        widen(grads[0]), widen(s[0]), {dim}, s[3], s[4], s[1], s[2],
        {ctx->needs_input_grad(0), ctx->needs_input_grad(1), ctx->needs_input_grad(2)});
    return {gx.defined() ? gx.to(s[0].scalar_type()) : gx, gw, gb, at::Tensor(), at::Tensor()};
  }
};

/// Softmax of fp32 scores returned and saved as bf16 probabilities.
struct NarrowSoftmax : torch::autograd::Function<NarrowSoftmax> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& s, at::ScalarType dtype) {
    at::Tensor p = at::softmax(s, -1).to(dtype);
    ctx->save_for_backward({p});
    return p;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor p = widen(ctx->get_saved_variables()[0]), g = widen(grads[0]);
    return {p * (g - (g * p).sum(-1, /*keepdim=*/true)), at::Tensor()};
  }
};

}  // namespace

at::Tensor layer_norm(const at::Tensor& x, std::int64_t dim, const at::Tensor& w, const at::Tensor& b, double eps) {
  if (x.scalar_type() == at::kFloat) return wgrad::layer_norm(x, dim, w, b, eps);
  return NarrowLayerNorm::apply(x, w, b, dim, eps);
}

at::Tensor softmax_as(const at::Tensor& s, at::ScalarType dtype) {
  if (dtype == at::kFloat) return at::softmax(s, -1);
  return NarrowSoftmax::apply(s, dtype);
}

void set_product_kernel(ProductKernel k) { g_kernel.store(k); }
ProductKernel product_kernel() { return g_kernel.load(); }

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__)
  static const bool ok = __builtin_cpu_supports("avx512bf16");
  return ok;
#else
  return false;
#endif
}

const char* to_string(ProductKernel k) { return k == ProductKernel::kNative ? "native" : "widen"; }

at::Tensor cast(const at::Tensor& t, at::ScalarType dtype) {
  return !t.defined() || t.scalar_type() == dtype ? t : t.to(dtype);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const at::ScalarType dt = x.scalar_type();
  if (dt == at::kFloat && w.scalar_type() == at::kFloat) {
    // Zero-bubble schedules: B now, W later (include/hp/model/weight_grad.h);
    // W sums into .grad, so only for parameters themselves (not a view of
    // a stack, as SwiGLU experts cut theirs: autograd sums those).
    if (wgrad::splitting() && w.is_leaf() && w.requires_grad() && at::GradMode::is_enabled() &&
        (!b.defined() || b.is_leaf()))
      return wgrad::split_linear(x, w, b);
    return at::linear(x, w, b);
  }
  if (dt == at::kBFloat16 && product_kernel() == ProductKernel::kWiden) {
    return WidenLinear::apply(x, w, b.defined() ? b : at::empty({0}, w.options()));
  }
  return at::linear(x, cast(w, dt), cast(b, dt));
}

at::Tensor matmul(const at::Tensor& a, const at::Tensor& b) {
  const at::ScalarType dt = a.scalar_type();
  if (dt == at::kFloat && b.scalar_type() == at::kFloat) return at::matmul(a, b);
  const at::Tensor bc = cast(b, dt);
  const bool same_batch = a.dim() == bc.dim() && a.dim() >= 2 &&
                          a.sizes().slice(0, a.dim() - 2).equals(bc.sizes().slice(0, bc.dim() - 2));
  if (dt == at::kBFloat16 && product_kernel() == ProductKernel::kWiden && same_batch) {
    return WidenMatmul::apply(a, bc);
  }
  return at::matmul(a, bc);
}

}  // namespace precision
}  // namespace hp
