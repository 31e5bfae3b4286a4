#include "framework/model/block_attention.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace hp {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// [B, T, h, d] -> contiguous [B * h, T, d].
at::Tensor to_rows(const at::Tensor& x) {
  return x.transpose(1, 2).reshape({x.size(0) * x.size(2), x.size(1), x.size(3)}).contiguous();
}

/// True where key column c0 + j lies after query row r0 + i (masked).
/// Only blocks that cross the diagonal need it.
at::Tensor future_mask(std::int64_t r0, std::int64_t rows, std::int64_t c0, std::int64_t cols,
                       const at::TensorOptions& opts) {
  auto r = at::arange(r0, r0 + rows, opts.dtype(at::kLong)).unsqueeze(1);
  auto c = at::arange(c0, c0 + cols, opts.dtype(at::kLong)).unsqueeze(0);
  return c > r;  // [rows, cols]
}

/// Scores of query rows [r0, r0 + rows) against key columns [c0, c0 + cols),
/// the future masked to -inf. `qs` is already scaled by 1 / sqrt(d).
at::Tensor block_scores(const at::Tensor& qs_i, const at::Tensor& k, std::int64_t r0,
                        std::int64_t rows, std::int64_t c0, std::int64_t cols) {
  auto k_j = k.narrow(1, c0, cols);
  auto s = at::bmm(qs_i, k_j.transpose(1, 2));  // [BH, rows, cols]
  if (c0 + cols - 1 > r0) s.masked_fill_(future_mask(r0, rows, c0, cols, s.options()), kNegInf);
  return s;
}

struct BlockAttention : torch::autograd::Function<BlockAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in,
                            const at::Tensor& v_in, std::int64_t block) {
    const auto B = q_in.size(0), T = q_in.size(1), h = q_in.size(2), d = q_in.size(3);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    auto q = to_rows(q_in), k = to_rows(k_in), v = to_rows(v_in);  // [BH, T, d]
    auto qs = q * scale;
    auto out = at::empty_like(q);
    auto lse = at::empty({B * h, T}, q.options());
    for (std::int64_t r0 = 0; r0 < T; r0 += block) {
      const auto rows = std::min(block, T - r0);
      auto qs_i = qs.narrow(1, r0, rows);
      at::Tensor m, l, acc;  // running row max [BH, rows, 1], sum, unnormalised output
      // Key blocks wholly after the last row of this query block are skipped.
      for (std::int64_t c0 = 0; c0 < r0 + rows; c0 += block) {
        const auto cols = std::min(block, T - c0);
        auto s = block_scores(qs_i, k, r0, rows, c0, cols);
        auto v_j = v.narrow(1, c0, cols);
        if (!m.defined()) {
          // The first key block holds column 0, which every row sees: m is finite.
          m = std::get<0>(s.max(-1, /*keepdim=*/true));
          auto p = (s - m).exp_();
          l = p.sum(-1, /*keepdim=*/true);
          acc = at::bmm(p, v_j);
          continue;
        }
        auto m_new = at::maximum(m, std::get<0>(s.max(-1, /*keepdim=*/true)));
        auto alpha = (m - m_new).exp_();
        auto p = (s - m_new).exp_();
        l = l * alpha + p.sum(-1, /*keepdim=*/true);
        acc = acc * alpha + at::bmm(p, v_j);
        m = m_new;
      }
      out.narrow(1, r0, rows).copy_(acc / l);
      lse.narrow(1, r0, rows).copy_((m + l.log()).squeeze(-1));
    }
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["block"] = block;
    ctx->saved_data["batch"] = B;
    return out.view({B, h, T, d}).transpose(1, 2).reshape({B, T, h * d});
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const auto block = ctx->saved_data["block"].toInt();
    const auto B = ctx->saved_data["batch"].toInt();
    const auto BH = q.size(0), T = q.size(1), d = q.size(2), h = BH / B;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    // dO back to [BH, T, d].
    auto dout = grads[0].reshape({B, T, h, d}).transpose(1, 2).reshape({BH, T, d}).contiguous();
    auto D = (dout * out).sum(-1, /*keepdim=*/true);  // [BH, T, 1]: rowsum(dO * O)
    auto qs = q * scale;
    auto dq = at::zeros_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
    for (std::int64_t r0 = 0; r0 < T; r0 += block) {
      const auto rows = std::min(block, T - r0);
      auto qs_i = qs.narrow(1, r0, rows);
      auto do_i = dout.narrow(1, r0, rows);
      auto lse_i = lse.narrow(1, r0, rows).unsqueeze(-1);
      auto D_i = D.narrow(1, r0, rows);
      auto dq_i = dq.narrow(1, r0, rows);
      for (std::int64_t c0 = 0; c0 < r0 + rows; c0 += block) {
        const auto cols = std::min(block, T - c0);
        auto p =
            block_scores(qs_i, k, r0, rows, c0, cols).sub_(lse_i).exp_();  // masked: exp(-inf) = 0
        auto k_j = k.narrow(1, c0, cols), v_j = v.narrow(1, c0, cols);
        dv.narrow(1, c0, cols).add_(at::bmm(p.transpose(1, 2), do_i));
        auto ds = p.mul_(at::bmm(do_i, v_j.transpose(1, 2)).sub_(D_i));  // dS = P * (dP - D)
        dq_i.add_(at::bmm(ds, k_j));
        dk.narrow(1, c0, cols).add_(at::bmm(ds.transpose(1, 2), qs_i));
      }
    }
    dq.mul_(scale);
    auto back = [&](const at::Tensor& g) {
      return g.view({B, h, T, d}).transpose(1, 2);
    };  // [B, T, h, d]
    return {back(dq), back(dk), back(dv), at::Tensor()};
  }
};

}  // namespace

at::Tensor block_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  std::int64_t block) {
  if (block < 1) {
    throw std::invalid_argument("block_causal_attention: block = " + std::to_string(block) +
                                ": must be >= 1");
  }
  if (q.dim() != 4 || !q.sizes().equals(k.sizes()) || !q.sizes().equals(v.sizes())) {
    throw std::invalid_argument(
        "block_causal_attention: q, k and v must all be [batch, seq, heads, head_dim]");
  }
  return BlockAttention::apply(q, k, v, block);
}

}  // namespace hp
