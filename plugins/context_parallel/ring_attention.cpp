#include "plugins/context_parallel/ring_attention.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <chrono>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "hp/comm/group.h"
#include "hp/comm/placement.h"
#include "hp/profile/trace.h"
#include "hp/model/block_attention.h"

namespace hp::context_parallel {

namespace {

/// Member `index` of `parts` along a sequence of `len`: the mesh's head-tail
/// placement (chunks index and 2 parts - 1 - index of 2 parts).
dist::Part head_tail_part(std::int64_t len, int parts, int index) {
  return dist::part_of({len}, {{"cp", dist::Placement::head_tail(0)}}, {{parts, index}});
}

}  // namespace

std::vector<SeqPiece> balanced_pieces(std::int64_t global_len, int parts, int index) {
  std::vector<SeqPiece> pieces;
  for (const auto& box : head_tail_part(global_len, parts, index).boxes) {
    pieces.push_back({box.offsets[0], box.lengths[0]});
  }
  return pieces;
}

at::Tensor gather_sequence(const at::Tensor& x, dist::Group& group) {
  const int cp = group.size();
  const auto local = x.size(1);
  at::Tensor all = group.all_gather(x.contiguous(), 1);  // members in order, each in its local order
  at::Tensor out = at::empty_like(all);
  for (int m = 0; m < cp; ++m) {
    // Member m's head-tail part of the whole along dimension 1, put back in place.
    const dist::Part part =
        dist::part_of(out.sizes().vec(), {{"cp", dist::Placement::head_tail(1)}}, {{cp, m}});
    dist::place(out, all.narrow(1, m * local, local), part);
  }
  return out;
}

namespace {

RingTimes g_times;  // the ring runs on the threads that run the model's forward and backward, one at a time
std::atomic<std::int64_t> g_blocks{0};  // counted on the threads that split the heads

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Times one ring step's block computations (a trace span and the figures).
template <class F>
void timed_step(const char* name, int step, const F& f) {
  profile::Span span("compute", name);
  span.arg("ring_step", step);
  const auto t0 = std::chrono::steady_clock::now();
  f();
  g_times.compute_seconds += seconds_since(t0);
  g_times.steps += 1;
}

}  // namespace

RingTimes take_ring_times() {
  RingTimes t = g_times;
  g_times = RingTimes{};
  t.blocks = g_blocks.exchange(0);
  return t;
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
namespace bs = block_step;

// Message tags: keys and values, and their gradients, may be in flight
// between the same two members at once.
constexpr int kTagKv = 11;
constexpr int kTagGrad = 12;

/// The global chunk index of local chunk `which` (0 or 1) of member `m`.
int chunk_of(int m, int which, int cp) { return which == 0 ? m : 2 * cp - 1 - m; }

/// Calls f(r0, rows, c0, cols, mask) for every block of query chunk `qc`
/// against key chunk `kc` (both `L` positions, cut into blocks of `block`)
/// that a query may see: every block when kc < qc; on the diagonal (kc ==
/// qc) the blocks at or below it, the one crossing it masked by `diag`; none
/// when kc > qc (wholly in the future of every query).
template <class F>
void for_each_block(int qc, int kc, std::int64_t L, std::int64_t block, const at::Tensor& diag, const F& f) {
  if (kc > qc) return;
  for (std::int64_t r0 = 0; r0 < L; r0 += block) {
    const auto rows = std::min(block, L - r0);
    const std::int64_t c_end = kc == qc ? r0 + 1 : L;
    for (std::int64_t c0 = 0; c0 < c_end; c0 += block) {
      const auto cols = std::min(block, L - c0);
      f(r0, rows, c0, cols, kc == qc && c0 == r0 ? diag.narrow(0, 0, rows).narrow(1, 0, cols) : at::Tensor());
    }
  }
}

/// Keys and values of this member as one message: [2, B * h, T, d].
at::Tensor pack_kv(const at::Tensor& k, const at::Tensor& v) {
  const auto B = k.size(0), T = k.size(1), h = k.size(2), d = k.size(3);
  auto kv = at::empty({2, B, h, T, d}, k.options());
  kv[0].copy_(k.transpose(1, 2));
  kv[1].copy_(v.transpose(1, 2));
  return kv.view({2, B * h, T, d});
}

/// Posts the exchange of one ring step: `out` goes to the next member,
/// the previous member's message arrives in a new tensor.
struct RingStep {
  std::unique_ptr<dist::Work> send, recv;
  at::Tensor in;
  RingStep(dist::Group& g, const at::Tensor& out, int tag) : in(at::empty_like(out)) {
    const int cp = g.size(), r = g.rank();
    send = g.isend(out, (r + 1) % cp, tag);
    recv = g.irecv(in, (r - 1 + cp) % cp, tag);
  }
  at::Tensor wait() {
    profile::Span span("comm", "ring_wait");
    const auto t0 = std::chrono::steady_clock::now();
    recv->wait();
    send->wait();
    g_times.wait_seconds += seconds_since(t0);
    return in;
  }
};

struct RingAttention : torch::autograd::Function<RingAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in,
                            const at::Tensor& v_in, std::int64_t group_address, std::int64_t block,
                            const bs::DocumentsArg& documents_arg) {
    const at::Tensor& documents = documents_arg.t;
    auto& g = *reinterpret_cast<dist::Group*>(static_cast<std::intptr_t>(group_address));
    const int cp = g.size(), r = g.rank();
    const auto B = q_in.size(0), T = q_in.size(1), h = q_in.size(2), d = q_in.size(3), L = T / 2;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    // bf16 inputs (mixed precision): keys and values travel in bf16 (half
    // the bytes); each chunk is widened to fp32 for the products, and the
    // running statistics, accumulation and log-sum-exp are fp32.
    const at::ScalarType dt = q_in.scalar_type();
    const bool narrow = dt != at::kFloat;
    const at::Tensor q16 = narrow ? bs::to_rows(q_in) : at::Tensor();
    auto q = narrow ? q16.to(at::kFloat).mul_(scale) : bs::to_rows(q_in).mul_(scale);  // [BH, T, d], scaled
    auto kv = pack_kv(k_in, v_in);
    const auto bd = std::min(block, L);
    const auto diag = at::ones({bd, bd}, q.options().dtype(at::kBool)).triu(1);
    // One running state per query block of each local chunk of each head.
    const std::int64_t nrb = (L + block - 1) / block;
    std::vector<bs::OnlineSoftmax> state(static_cast<std::size_t>(B * h * 2 * nrb));
    // Documents (by global position: chunk c holds [c L, (c + 1) L)).
    const at::Tensor docs = documents.defined() ? documents.contiguous() : documents;
    at::Tensor cur = kv;
    for (int s = 0; s < cp; ++s) {
      const int src = (r - s + cp) % cp;  // whose keys and values `cur` holds
      std::unique_ptr<RingStep> next;
      if (s + 1 < cp) next = std::make_unique<RingStep>(g, cur, kTagKv);  // ahead of use
      const at::Tensor kvf = narrow ? cur.to(at::kFloat) : cur;
      timed_step("ring_attention_step", s, [&] {
        bs::for_each_head(B * h, [&](std::int64_t bh) {
          // The head's rows taken once, not per block (each a view op).
          const at::Tensor q_h = q[bh], k_h = kvf[0][bh], v_h = kvf[1][bh];
          const at::Tensor docs_h = docs.defined() ? docs[bh / h] : at::Tensor();
          for (int qi = 0; qi < 2; ++qi) {
            for (int ki = 0; ki < 2; ++ki) {
              const int qc = chunk_of(r, qi, cp), kc = chunk_of(src, ki, cp);
              for_each_block(qc, kc, L, block, diag,
                             [&](std::int64_t r0, std::int64_t rows, std::int64_t c0, std::int64_t cols,
                                 const at::Tensor& causal) {
                               at::Tensor mask = causal;
                               if (docs_h.defined() &&
                                   !bs::document_block(docs_h, qc * L + r0, rows, kc * L + c0, cols, mask))
                                 return;
                               g_blocks.fetch_add(1, std::memory_order_relaxed);
                               auto& st = state[static_cast<std::size_t>((bh * 2 + qi) * nrb + r0 / block)];
                               bs::add_block(st, q_h.narrow(0, qi * L + r0, rows), k_h.narrow(0, ki * L + c0, cols),
                                             v_h.narrow(0, ki * L + c0, cols), mask, docs_h.defined());
                             });
            }
          }
        });
      });
      if (next) cur = next->wait();
    }
    auto out = at::empty({B, T, h * d}, q.options());
    auto out_heads = out.view({B, T, h, d}).permute({0, 2, 1, 3});
    auto lse = at::empty({B * h, T}, q.options());
    bs::for_each_head(B * h, [&](std::int64_t bh) {
      for (int qi = 0; qi < 2; ++qi) {
        for (std::int64_t r0 = 0; r0 < L; r0 += block) {
          const auto rows = std::min(block, L - r0);
          bs::finish(state[static_cast<std::size_t>((bh * 2 + qi) * nrb + r0 / block)],
                     out_heads[bh / h][bh % h].narrow(0, qi * L + r0, rows), lse[bh].narrow(0, qi * L + r0, rows));
        }
      }
    });
    ctx->saved_data["group"] = group_address;
    ctx->saved_data["block"] = block;
    ctx->saved_data["heads"] = h;
    ctx->saved_data["narrow"] = narrow;
    ctx->saved_data["documents"] = docs;
    if (narrow) {
      at::Tensor out16 = out.to(dt);
      ctx->save_for_backward({q16, kv, out16, lse});
      return out16;
    }
    ctx->save_for_backward({q, kv, out, lse});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const bool narrow = ctx->saved_data["narrow"].toBool();
    const at::ScalarType dt = saved[1].scalar_type();
    const auto& kv = saved[1];
    const auto& lse = saved[3];
    const auto group_address = ctx->saved_data["group"].toInt();
    auto& g = *reinterpret_cast<dist::Group*>(static_cast<std::intptr_t>(group_address));
    const int cp = g.size(), r = g.rank();
    const auto h = ctx->saved_data["heads"].toInt();
    const auto block = ctx->saved_data["block"].toInt();
    const auto BH = saved[0].size(0), T = saved[0].size(1), d = saved[0].size(2), B = BH / h, L = T / 2;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    // bf16 saved tensors widened (q scaled as the forward scaled it).
    const at::Tensor q = narrow ? saved[0].to(at::kFloat).mul_(scale) : saved[0];
    const at::Tensor out = narrow ? saved[2].to(at::kFloat) : saved[2];
    auto dout = (narrow ? grads[0].to(at::kFloat) : grads[0]).contiguous();
    auto do_heads = dout.view({B, T, h, d}).permute({0, 2, 1, 3});
    auto o_heads = out.view({B, T, h, d}).permute({0, 2, 1, 3});
    auto D = at::empty({BH, T, 1}, q.options());  // rowsum(dO * O)
    bs::for_each_head(BH, [&](std::int64_t bh) {
      D[bh].copy_((do_heads[bh / h][bh % h] * o_heads[bh / h][bh % h]).sum(-1, /*keepdim=*/true));
    });
    auto lse3 = lse.unsqueeze(-1);
    const auto bd = std::min(block, L);
    const auto diag = at::ones({bd, bd}, q.options().dtype(at::kBool)).triu(1);
    auto dq = at::zeros_like(q);
    const at::Tensor docs = ctx->saved_data["documents"].toTensor();
    at::Tensor cur = kv;
    // The gradients of the keys and values held at step s travel with them:
    // each member adds its share and passes them on; after the last step they
    // reach their owner.
    std::unique_ptr<RingStep> grads_in;  // the gradients passed on at the last step, and those arriving
    at::Tensor mine;
    for (int s = 0; s < cp; ++s) {
      const int src = (r - s + cp) % cp;
      std::unique_ptr<RingStep> next;
      if (s + 1 < cp) next = std::make_unique<RingStep>(g, cur, kTagKv);
      const at::Tensor kvf = narrow ? cur.to(at::kFloat) : cur;
      // [2, BH, T, d]: this member's share for `src`, summed in fp32 (the
      // shares travel in the inputs' type).
      auto dkv = at::zeros(kv.sizes(), q.options());
      timed_step("ring_attention_backward_step", s, [&] {
        bs::for_each_head(BH, [&](std::int64_t bh) {
          // The head's rows taken once, not per block (each a view op).
          const at::Tensor do_h = do_heads[bh / h][bh % h], q_h = q[bh], k_h = kvf[0][bh], v_h = kvf[1][bh];
          const at::Tensor lse_h = lse3[bh], D_h = D[bh], dq_h = dq[bh], dk_h = dkv[0][bh], dv_h = dkv[1][bh];
          const at::Tensor docs_h = docs.defined() ? docs[bh / h] : at::Tensor();
          for (int qi = 0; qi < 2; ++qi) {
            for (int ki = 0; ki < 2; ++ki) {
              const int qc = chunk_of(r, qi, cp), kc = chunk_of(src, ki, cp);
              for_each_block(
                  qc, kc, L, block, diag,
                  [&](std::int64_t r0, std::int64_t rows, std::int64_t c0, std::int64_t cols, const at::Tensor& causal) {
                    at::Tensor mask = causal;
                    if (docs_h.defined() && !bs::document_block(docs_h, qc * L + r0, rows, kc * L + c0, cols, mask))
                      return;
                    g_blocks.fetch_add(1, std::memory_order_relaxed);
                    const auto qr = qi * L + r0, kr = ki * L + c0;
                    bs::backward_block(q_h.narrow(0, qr, rows), k_h.narrow(0, kr, cols), v_h.narrow(0, kr, cols),
                                       do_h.narrow(0, qr, rows), lse_h.narrow(0, qr, rows), D_h.narrow(0, qr, rows),
                                       mask, dq_h.narrow(0, qr, rows), dk_h.narrow(0, kr, cols),
                                       dv_h.narrow(0, kr, cols));
                  });
            }
          }
        });
      });
      if (grads_in) dkv.add_(grads_in->wait());  // what the members before added for `src`
      if (cp == 1) {
        mine = dkv;
      } else {
        grads_in = std::make_unique<RingStep>(g, narrow ? dkv.to(dt) : dkv, kTagGrad);
      }
      if (next) cur = next->wait();
    }
    if (cp > 1) mine = grads_in->wait();  // for this member's own keys and values, from the last member
    dq.mul_(scale);
    auto back = [&](const at::Tensor& t) {
      auto r = t.view({B, h, T, d}).transpose(1, 2);
      return narrow ? r.to(dt) : r;
    };  // [B, T, h, d]
    return {back(dq), back(mine[0]), back(mine[1]), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, dist::Group& group,
                          std::int64_t block, const at::Tensor& documents) {
  if (q.dim() != 4 || !q.sizes().equals(k.sizes()) || !q.sizes().equals(v.sizes()) || q.size(1) % 2 != 0) {
    throw std::invalid_argument(
        "ring_attention: q, k and v must all be [batch, local seq, heads, head_dim] with an even local seq (two "
        "chunks)");
  }
  if (block < 1) throw std::invalid_argument("ring_attention: block = " + std::to_string(block) + ": must be >= 1");
  if (documents.defined() && (documents.dim() != 2 || documents.size(0) != q.size(0) ||
                              documents.size(1) != q.size(1) * group.size())) {
    throw std::invalid_argument("ring_attention: documents must be [batch, global seq] = [" +
                                std::to_string(q.size(0)) + ", " + std::to_string(q.size(1) * group.size()) + "]");
  }
  return RingAttention::apply(q, k, v, static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(&group)), block,
                              bs::DocumentsArg{documents});
}

SequenceLayout balanced_layout(dist::Group& g, std::int64_t block) {
  SequenceLayout layout;
  layout.parts = g.size();
  layout.pieces = [parts = g.size(), index = g.rank()](std::int64_t len) {
    return balanced_pieces(len, parts, index);
  };
  layout.attention = [&g, block](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& documents) { return ring_attention(q, k, v, g, block, documents); };
  // Each rank's queries see 2 parts - 1 chunks whole and its own two on
  // the diagonal (the blocks at or below it), whatever its place in the
  // ring: (2 parts - 1) nb^2 + nb (nb + 1) blocks of the chunk's nb.
  layout.attention_blocks = [parts = g.size(), block](std::int64_t len) {
    const std::int64_t chunk = len / (2 * parts), size = std::min(block, chunk);
    const double nb = static_cast<double>((chunk + size - 1) / std::max<std::int64_t>(1, size));
    return SequenceLayout::Blocks{size, (2.0 * parts - 1) * nb * nb + nb * (nb + 1)};
  };
  layout.sum = [&g](at::Tensor& t) { g.all_reduce(t); };
  layout.gather = [&g](const at::Tensor& x) { return gather_sequence(x, g); };
  return layout;
}

}  // namespace hp::context_parallel
