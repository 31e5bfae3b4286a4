#pragma once
// Adam / AdamW in one pass over memory: each element of the parameter, its
// gradient and its two moments is read once and written once, where the
// chain of tensor operations (decay, two moment updates, sqrt, division,
// addcdiv) walks the four tensors about nine times and allocates two
// temporaries the size of the parameter. PyTorch's formulas
// (torch.optim.Adam(W)) with the roundings of LibTorch's own CPU kernels, so
// the numbers are bitwise those of the tensor operations; elementwise, so
// they do not depend on the number of threads.
#include <cstdint>

namespace hp {

struct AdamScalars {
  /// AdamW: the parameter is first multiplied by this (1 - lr * weight_decay).
  float decay = 1.0f;
  /// Adam: weight_decay added to the gradient times the parameter (0: none).
  float l2 = 0.0f;
  float beta1 = 0.9f, one_minus_beta1 = 0.1f, beta2 = 0.999f, one_minus_beta2 = 0.001f;
  /// sqrt(1 - beta2^t), eps, and -lr / (1 - beta1^t).
  float sqrt_bc2 = 1.0f, eps = 1e-8f, step = 0.0f;
};

/// Updates n elements of p, m and v in place from g.
void adam_fused(const AdamScalars& s, std::int64_t n, float* p, const float* g, float* m, float* v);

}  // namespace hp
