#include "hp/model/block_attention.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
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

/// The mask of key block [c0, c0 + cols) for query rows [r0, r0 + rows):
/// key blocks start at multiples of the block length as query blocks do, so
/// the only block that crosses the diagonal is c0 == r0, masked by `diag`
/// (true above the diagonal, [min(block, seq)]^2); blocks after it are never
/// asked for. Undefined (no mask) below the diagonal.
at::Tensor diag_mask(const at::Tensor& diag, std::int64_t r0, std::int64_t rows, std::int64_t c0,
                     std::int64_t cols) {
  return c0 == r0 ? diag.narrow(0, 0, rows).narrow(1, 0, cols) : at::Tensor();
}

}  // namespace

namespace block_step {

at::Tensor to_rows(const at::Tensor& x) {
  const auto B = x.size(0), T = x.size(1), h = x.size(2), d = x.size(3);
  auto r = at::empty({B, h, T, d}, x.options());
  r.copy_(x.transpose(1, 2));
  return r.view({B * h, T, d});
}

void for_each_head(std::int64_t BH, const std::function<void(std::int64_t)>& f) {
  at::parallel_for(0, BH, 1, [&](std::int64_t begin, std::int64_t end) {
    c10::NoGradGuard no_grad;
    for (std::int64_t bh = begin; bh < end; ++bh) f(bh);
  });
}

void add_block(OnlineSoftmax& st, const at::Tensor& qs, const at::Tensor& k, const at::Tensor& v,
               const at::Tensor& mask, bool rows_may_be_hidden) {
  auto s = at::mm(qs, k.t());  // [rows, cols]
  if (mask.defined()) s.masked_fill_(mask, kNegInf);
  if (rows_may_be_hidden) {
    // A row that has seen no key yet keeps m = -inf; its exponentials are
    // taken against 0 instead (all zero), so no -inf - -inf.
    auto m_new = std::get<0>(s.max(-1, /*keepdim=*/true));
    if (st.m.defined()) m_new = at::maximum(st.m, m_new);
    auto m_safe = m_new.masked_fill(m_new.eq(kNegInf), 0.0f);
    auto p = (s - m_safe).exp_();
    if (!st.m.defined()) {
      st.l = p.sum(-1, /*keepdim=*/true);
      st.acc = at::mm(p, v);
    } else {
      auto alpha = (st.m - m_safe).exp_();
      st.l = st.l * alpha + p.sum(-1, /*keepdim=*/true);
      st.acc = st.acc * alpha + at::mm(p, v);
    }
    st.m = m_new;
    return;
  }
  if (!st.m.defined()) {
    // Every row of a block given here sees at least one key: m is finite.
    st.m = std::get<0>(s.max(-1, /*keepdim=*/true));
    auto p = (s - st.m).exp_();
    st.l = p.sum(-1, /*keepdim=*/true);
    st.acc = at::mm(p, v);
    return;
  }
  auto m_new = at::maximum(st.m, std::get<0>(s.max(-1, /*keepdim=*/true)));
  auto alpha = (st.m - m_new).exp_();
  auto p = (s - m_new).exp_();
  st.l = st.l * alpha + p.sum(-1, /*keepdim=*/true);
  st.acc = st.acc * alpha + at::mm(p, v);
  st.m = m_new;
}

void finish(const OnlineSoftmax& st, at::Tensor out, at::Tensor lse) {
  out.copy_(st.acc / st.l);
  lse.copy_((st.m + st.l.log()).squeeze(-1));
}

void backward_block(const at::Tensor& qs, const at::Tensor& k, const at::Tensor& v, const at::Tensor& dout,
                    const at::Tensor& lse, const at::Tensor& D, const at::Tensor& mask, at::Tensor dq,
                    at::Tensor dk, at::Tensor dv) {
  auto s = at::mm(qs, k.t());
  if (mask.defined()) s.masked_fill_(mask, kNegInf);
  auto p = s.sub_(lse).exp_();  // masked entries: exp(-inf) = 0
  dv.add_(at::mm(p.t(), dout));
  auto ds = p.mul_(at::mm(dout, v.t()).sub_(D));  // dS = P * (dP - D)
  dq.add_(at::mm(ds, k));
  dk.add_(at::mm(ds.t(), qs));
}

bool document_block(const at::Tensor& docs, std::int64_t q0, std::int64_t rows, std::int64_t k0, std::int64_t cols,
                    at::Tensor& mask) {
  const auto* d = docs.data_ptr<std::int64_t>();
  if (d[k0 + cols - 1] < d[q0]) return false;          // every key in an earlier document
  if (d[k0] == d[q0 + rows - 1]) return true;           // one document: causal only
  auto other = docs.narrow(0, q0, rows).unsqueeze(1).ne(docs.narrow(0, k0, cols).unsqueeze(0));
  mask = mask.defined() ? mask.logical_or(other) : other;
  return true;
}

}  // namespace block_step

namespace {

using block_step::DocumentsArg;
using block_step::for_each_head;
using block_step::to_rows;

struct BlockAttention : torch::autograd::Function<BlockAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in,
                            const at::Tensor& v_in, std::int64_t block, const DocumentsArg& documents_arg) {
    const at::Tensor& documents = documents_arg.t;
    const auto B = q_in.size(0), T = q_in.size(1), h = q_in.size(2), d = q_in.size(3);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    // Saved for backward: q already scaled (one [B·h, T, d] copy, not two),
    // k, v, the output itself (the tensor returned, in its [B, T, h·d]
    // layout, which the output projection keeps anyway) and the row lse.
    // bf16 inputs (mixed precision): the rows are kept in bf16 for
    // backward and widened to fp32 for the products, statistics and
    // accumulation; the output is cast back to bf16.
    const at::ScalarType dt = q_in.scalar_type();
    const bool narrow = dt != at::kFloat;
    at::Tensor q16, k16, v16, q, k, v;  // [BH, T, d]
    if (narrow) {
      q16 = to_rows(q_in), k16 = to_rows(k_in), v16 = to_rows(v_in);
      q = q16.to(at::kFloat).mul_(scale), k = k16.to(at::kFloat), v = v16.to(at::kFloat);
    } else {
      q = to_rows(q_in).mul_(scale), k = to_rows(k_in), v = to_rows(v_in);
    }
    auto out = at::empty({B, T, h * d}, q.options());
    auto out_heads = out.view({B, T, h, d}).permute({0, 2, 1, 3});  // [B, h, T, d] view
    auto lse = at::empty({B * h, T}, q.options());
    const auto bd = std::min(block, T);
    const auto diag = at::ones({bd, bd}, q.options().dtype(at::kBool)).triu(1);
    const at::Tensor docs = documents.defined() ? documents.contiguous() : documents;
    for_each_head(B * h, [&](std::int64_t bh) {
      const auto q_h = q[bh], k_h = k[bh], v_h = v[bh];  // [T, d]
      auto o_h = out_heads[bh / h][bh % h];
      auto lse_h = lse[bh];
      for (std::int64_t r0 = 0; r0 < T; r0 += block) {
        const auto rows = std::min(block, T - r0);
        auto qs_i = q_h.narrow(0, r0, rows);
        block_step::OnlineSoftmax st;  // running row max, sum and unnormalised output
        // Key blocks wholly after the last row of this query block are skipped.
        for (std::int64_t c0 = 0; c0 <= r0; c0 += block) {
          const auto cols = std::min(block, T - c0);
          at::Tensor mask = diag_mask(diag, r0, rows, c0, cols);
          if (docs.defined() && !block_step::document_block(docs[bh / h], r0, rows, c0, cols, mask)) continue;
          block_step::add_block(st, qs_i, k_h.narrow(0, c0, cols), v_h.narrow(0, c0, cols), mask, docs.defined());
        }
        block_step::finish(st, o_h.narrow(0, r0, rows), lse_h.narrow(0, r0, rows));
      }
    });
    ctx->saved_data["narrow"] = narrow;
    ctx->saved_data["documents"] = docs;
    if (narrow) {
      at::Tensor out16 = out.to(dt);
      ctx->save_for_backward({q16, k16, v16, out16, lse});
      ctx->saved_data["block"] = block;
      ctx->saved_data["heads"] = h;
      return out16;
    }
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["block"] = block;
    ctx->saved_data["heads"] = h;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const bool narrow = ctx->saved_data["narrow"].toBool();
    const at::ScalarType dt = saved[0].scalar_type();
    const auto block = ctx->saved_data["block"].toInt();
    const auto h = ctx->saved_data["heads"].toInt();
    const auto BH = saved[0].size(0), T = saved[0].size(1), d = saved[0].size(2), B = BH / h;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    // bf16 saved rows widened (q scaled as the forward scaled it).
    const at::Tensor q = narrow ? saved[0].to(at::kFloat).mul_(scale) : saved[0];
    const at::Tensor k = narrow ? saved[1].to(at::kFloat) : saved[1];
    const at::Tensor v = narrow ? saved[2].to(at::kFloat) : saved[2];
    const at::Tensor out = narrow ? saved[3].to(at::kFloat) : saved[3];
    const at::Tensor& lse = saved[4];
    // dO and O as [B, h, T, d] views of their [B, T, h·d] tensors (no copies).
    auto dout = (narrow ? grads[0].to(at::kFloat) : grads[0]).contiguous();
    auto do_heads = dout.view({B, T, h, d}).permute({0, 2, 1, 3});
    auto o_heads = out.view({B, T, h, d}).permute({0, 2, 1, 3});
    auto dq = at::zeros_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
    const auto bd = std::min(block, T);
    const auto diag = at::ones({bd, bd}, q.options().dtype(at::kBool)).triu(1);
    const at::Tensor docs = ctx->saved_data["documents"].toTensor();
    for_each_head(BH, [&](std::int64_t bh) {
      const auto q_h = q[bh], k_h = k[bh], v_h = v[bh];
      const auto do_h = do_heads[bh / h][bh % h], o_h = o_heads[bh / h][bh % h];
      auto dq_h = dq[bh], dk_h = dk[bh], dv_h = dv[bh];
      auto D = (do_h * o_h).sum(-1, /*keepdim=*/true);  // [T, 1]: rowsum(dO * O)
      auto lse_h = lse[bh].unsqueeze(-1);
      for (std::int64_t r0 = 0; r0 < T; r0 += block) {
        const auto rows = std::min(block, T - r0);
        auto qs_i = q_h.narrow(0, r0, rows);
        auto do_i = do_h.narrow(0, r0, rows);
        auto lse_i = lse_h.narrow(0, r0, rows);
        auto D_i = D.narrow(0, r0, rows);
        auto dq_i = dq_h.narrow(0, r0, rows);
        for (std::int64_t c0 = 0; c0 <= r0; c0 += block) {
          const auto cols = std::min(block, T - c0);
          at::Tensor mask = diag_mask(diag, r0, rows, c0, cols);
          if (docs.defined() && !block_step::document_block(docs[bh / h], r0, rows, c0, cols, mask)) continue;
          block_step::backward_block(qs_i, k_h.narrow(0, c0, cols), v_h.narrow(0, c0, cols), do_i, lse_i, D_i, mask,
                                     dq_i, dk_h.narrow(0, c0, cols), dv_h.narrow(0, c0, cols));
        }
      }
    });
    dq.mul_(scale);
    auto back = [&](const at::Tensor& g) {
      auto r = g.view({B, h, T, d}).transpose(1, 2);
      return narrow ? r.to(dt) : r;
    };  // [B, T, h, d]
    return {back(dq), back(dk), back(dv), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor block_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  std::int64_t block, const at::Tensor& documents) {
  if (block < 1) {
    throw std::invalid_argument("block_causal_attention: block = " + std::to_string(block) +
                                ": must be >= 1");
  }
  if (q.dim() != 4 || !q.sizes().equals(k.sizes()) || !q.sizes().equals(v.sizes())) {
    throw std::invalid_argument(
        "block_causal_attention: q, k and v must all be [batch, seq, heads, head_dim]");
  }
  if (documents.defined() &&
      (documents.dim() != 2 || documents.size(0) != q.size(0) || documents.size(1) != q.size(1))) {
    throw std::invalid_argument("block_causal_attention: documents must be [batch, seq] = [" +
                                std::to_string(q.size(0)) + ", " + std::to_string(q.size(1)) + "]");
  }
  return BlockAttention::apply(q, k, v, block, block_step::DocumentsArg{documents});
}

std::string resolve_attention(const std::string& option, std::int64_t seq, std::int64_t auto_seq) {
  if (option != "auto") return option;
  return seq >= auto_seq ? "block" : "eager";
}

}  // namespace hp
