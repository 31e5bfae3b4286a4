#include "hp/model/moe.h"
#include "hp/model/weight_grad.h"
#include "hp/model/kv_cache.h"
#include "hp/model/precision.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/graph_task.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <mutex>
#include <utility>

#include "hp/comm/context.h"
#include "hp/profile/trace.h"
#include "hp/config/config.h"
#include "hp/config/schema.h"
#include "hp/logging/logging.h"
#include "framework/metrics/metrics.h"
#include "hp/model/aux_loss.h"
#include "hp/model/build_context.h"
#include "framework/model/packed_gemm.h"
#include "framework/model/tensor_dump.h"
#include "hp/plugin/feature_runtime.h"

namespace hp {

MoeOptions MoeOptions::from(const Config& c) {
  MoeOptions o;
  o.num_experts = c.get_int("model.moe.num_experts");
  o.top_k = c.get_int("model.moe.top_k");
  o.every = c.get_int("model.moe.every");
  o.ffn_hidden = c.get_int("model.moe.ffn_hidden");
  o.shared_experts = c.get_int("model.moe.shared_experts");
  o.sigmoid = c.get_string("model.moe.score") == "sigmoid";
  o.renormalize = c.get_bool("model.moe.renormalize");
  o.capacity_factor = c.get_float("model.moe.capacity_factor");
  o.aux_loss_coef = c.get_float("model.moe.aux_loss_coef");
  o.device_balance_coef = c.get_float("model.moe.device_balance_coef");
  o.device_groups = c.get_int("model.moe.device_groups");
  o.z_loss_coef = c.get_float("model.moe.z_loss_coef");
  o.bias_update_rate = c.get_float("model.moe.bias_update_rate");
  const std::string how = c.get_string("model.moe.expert_compute");
  o.compute = how == "padded"   ? ExpertCompute::kPadded
              : how == "slices" ? ExpertCompute::kSlices
                                : ExpertCompute::kPacked;
  return o;
}

std::int64_t MoeOptions::capacity(std::int64_t seq) const {
  return static_cast<std::int64_t>(std::ceil(capacity_factor * static_cast<double>(top_k * seq) /
                                             static_cast<double>(num_experts)));
}

void declare_moe_options(Schema& s) {
  auto once = [&](const std::string& path, auto declare) {
    if (!s.find(path)) declare();
  };
  once("model.moe.num_experts", [&] {
    s.add_int("model.moe.num_experts", 0)
        .range(0, 65536)
        .describe("Experts of each mixture-of-experts FFN.")
        .note("0: a dense FFN in every block");
  });
  once("model.moe.top_k", [&] {
    s.add_int("model.moe.top_k", 2).range(1, 64).describe("Experts each token is routed to.");
  });
  once("model.moe.every", [&] {
    s.add_int("model.moe.every", 1)
        .range(1, 1024)
        .describe(
            "Block i has a mixture-of-experts FFN when i is a multiple of this (1: every block).");
  });
  once("model.moe.ffn_hidden", [&] {
    s.add_int("model.moe.ffn_hidden", 0)
        .range(0, 262144)
        .describe("An expert's FFN width.")
        .note("0 means the model's FFN width");
  });
  once("model.moe.shared_experts", [&] {
    s.add_int("model.moe.shared_experts", 0)
        .range(0, 64)
        .describe("Experts every token goes through besides its routed ones.");
  });
  once("model.moe.score", [&] {
    s.add_enum("model.moe.score", "softmax", {"softmax", "sigmoid"})
        .describe("Router score function.");
  });
  once("model.moe.renormalize", [&] {
    s.add_bool("model.moe.renormalize", true)
        .describe("Divide a token's top-k weights by their sum.");
  });
  once("model.moe.capacity_factor", [&] {
    s.add_float("model.moe.capacity_factor", 0.0)
        .range(0.0, 64.0)
        .describe(
            "Slots per expert and sequence: ceil(factor x top_k x seq_len / num_experts); an "
            "expert keeps "
            "the assignments of highest probability (ties: the earlier token) and drops the rest.")
        .note("0: dropless");
  });
  once("model.moe.aux_loss_coef", [&] {
    s.add_float("model.moe.aux_loss_coef", 0.01)
        .range(0.0, 10.0)
        .describe("Load-balancing loss coefficient (per sequence, then the mean).");
  });
  once("model.moe.device_balance_coef", [&] {
    s.add_float("model.moe.device_balance_coef", 0.0)
        .range(0.0, 10.0)
        .describe(
            "Device-level balance loss coefficient (DeepSeek-V2): balances the token selections "
            "between model.moe.device_groups consecutive groups of experts, per sequence, then the "
            "mean.")
        .note("0: off");
  });
  once("model.moe.device_groups", [&] {
    s.add_int("model.moe.device_groups", 1)
        .range(1, 65536)
        .describe(
            "Consecutive expert groups the device-level balance loss balances; the expert "
            "parallel size makes each group one ep rank's experts. Must divide "
            "model.moe.num_experts.");
  });
  once("model.moe.z_loss_coef", [&] {
    s.add_float("model.moe.z_loss_coef", 0.0)
        .range(0.0, 10.0)
        .describe("Router z-loss coefficient.");
  });
  once("model.moe.bias_update_rate", [&] {
    s.add_float("model.moe.bias_update_rate", 0.0)
        .range(0.0, 1.0)
        .describe(
            "Aux-loss-free balancing: after each step every expert's selection bias moves by this "
            "rate "
            "towards the mean load (sign rule, over the global batch).")
        .note("0: off");
  });
  once("model.moe.expert_compute", [&] {
    s.add_enum("model.moe.expert_compute", "packed", {"packed", "slices", "padded"})
        .describe(
            "How a rank runs its experts on the tokens sorted by expert: packed (each expert's FFN "
            "on its contiguous rows, with the expert weights packed once per step for the "
            "project's own small-row product, its AVX-512 kernel where the CPU has AVX-512F, "
            "which also runs the weight gradients; x86-64 with AVX2 and FMA, fp32, widths "
            "multiples of 16, elsewhere as slices), slices (the same through BLAS, bitwise a linear per "
            "expert) or padded (one batched matmul over [experts, most rows, hidden], zero rows "
            "as padding: load imbalance x the FLOPs). Same results within float rounding.");
  });
}

void validate_moe_options(const Config& c, ConfigErrors& e) {
  if (!c.ok({"model.moe.num_experts", "model.moe.top_k"})) return;
  const auto E = c.get_int("model.moe.num_experts"), k = c.get_int("model.moe.top_k");
  if (E > 0 && k > E) {
    e.add("model.moe.top_k", std::to_string(k),
          "is more than model.moe.num_experts = " + std::to_string(E), "1 .. " + std::to_string(E));
  }
  if (E == 0 || !c.ok({"model.moe.device_groups", "model.moe.device_balance_coef"})) return;
  const auto G = c.get_int("model.moe.device_groups");
  if (c.get_float("model.moe.device_balance_coef") <= 0) return;
  if (G < 2 || E % G != 0) {
    e.add("model.moe.device_groups", std::to_string(G),
          G < 2 ? "the device-level balance loss (model.moe.device_balance_coef > 0) needs at least two "
                  "expert groups"
                : "must divide model.moe.num_experts = " + std::to_string(E),
          "a divisor of " + std::to_string(E) + " that is at least 2 (usually the expert parallel size)");
  }
}

Routing route(const at::Tensor& logits, const at::Tensor& bias, const MoeOptions& o,
              std::int64_t seq, const SequenceLayout* layout) {
  Routing r;
  r.logits = logits.to(at::kFloat);
  r.probs = o.sigmoid ? at::sigmoid(r.logits) : at::softmax(r.logits, -1);
  at::Tensor sel = r.probs.detach();
  if (bias.defined()) sel = sel + bias;
  // A stable descending sort keeps the lower expert index first among ties.
  at::Tensor order = std::get<1>(at::sort(sel, /*stable=*/true, /*dim=*/-1, /*descending=*/true));
  r.experts = std::get<0>(at::sort(order.narrow(-1, 0, o.top_k), -1));  // ascending within a token
  at::Tensor w = r.probs.gather(-1, r.experts);
  if (o.renormalize) w = w / w.sum(-1, true);
  const std::int64_t N = logits.size(0), k = o.top_k;
  r.kept = at::ones({N, k}, at::kBool);
  if (o.capacity_factor > 0 && !generating()) {
    at::Tensor experts = r.experts, chosen = r.probs.detach().gather(1, r.experts);
    std::int64_t full = seq, n_full = N;
    if (layout) {
      // Capacity ranks a whole sequence: decide on it, keep this rank's part.
      experts = layout->gather(experts.view({N / seq, seq, k}));
      chosen = layout->gather(chosen.view({N / seq, seq, k}));
      full = experts.size(1);
      n_full = experts.size(0) * full;
    }
    const std::int64_t C = o.capacity(full), E = o.num_experts, S = n_full / full, M = n_full * k;
    // Per sequence and expert: the assignments by probability (desc), then
    // token (asc), as tensor ops: a stable sort by probability, then a
    // stable sort by (sequence, expert); an assignment's place in its group
    // is its rank, and the first C of a group are kept.
    at::Tensor flat_e = experts.reshape({-1});
    at::Tensor p = chosen.reshape({-1});
    at::Tensor group = at::div(at::arange(M, at::kLong), k * full, "floor") * E + flat_e;
    at::Tensor by_p = std::get<1>(at::sort(p, /*stable=*/true, /*dim=*/0, /*descending=*/true));
    at::Tensor by_g =
        std::get<1>(at::sort(group.index_select(0, by_p), /*stable=*/true, /*dim=*/0, false));
    at::Tensor order = by_p.index_select(0, by_g);
    at::Tensor g_sorted = group.index_select(0, order);
    at::Tensor counts = at::bincount(g_sorted, {}, S * E);
    at::Tensor start = counts.cumsum(0) - counts;
    at::Tensor rank = at::arange(M, at::kLong) - start.index_select(0, g_sorted);
    r.kept = at::empty({M}, at::kBool).index_copy_(0, order, rank.lt(C)).view({n_full, k});
    if (layout)
      r.kept = take_pieces(r.kept.view({S, full, k}), 1, layout->pieces(full)).reshape({N, k});
    w = w * r.kept.to(w.scalar_type());
  }
  r.weights = w;
  return r;
}

namespace {

/// Per sequence [S, E]: f, the share of the sequence's k x T selections
/// each expert got (no gradient; under a sequence layout the whole
/// sequence's), and T x P, the probabilities summed over this rank's tokens.
std::pair<at::Tensor, at::Tensor> balance_terms(const Routing& r, const MoeOptions& o,
                                                std::int64_t seq, const SequenceLayout* layout) {
  const std::int64_t N = r.probs.size(0), E = r.probs.size(1), S = N / seq;
  at::Tensor counts =
      at::zeros({N, E}, at::kFloat).scatter_(1, r.experts, 1.0).view({S, seq, E}).sum(1);
  std::int64_t full = seq;
  if (layout) {
    layout->sum(counts);  // the whole sequence's selections
    full = seq * layout->parts;
  }
  return {counts / static_cast<double>(o.top_k * full), r.probs.view({S, seq, E}).sum(1)};
}

}  // namespace

at::Tensor load_balance_loss_sum(const Routing& r, const MoeOptions& o, std::int64_t seq,
                                 const SequenceLayout* layout) {
  auto [f, p_sum] = balance_terms(r, o, seq, layout);  // p_sum = T x P_e
  return o.aux_loss_coef * static_cast<double>(f.size(1)) * (f * p_sum).sum();
}

at::Tensor device_balance_loss_sum(const Routing& r, const MoeOptions& o, std::int64_t seq,
                                   const SequenceLayout* layout) {
  auto [f, p_sum] = balance_terms(r, o, seq, layout);
  const std::int64_t S = f.size(0), G = o.device_groups, per = f.size(1) / G;
  at::Tensor fg = f.view({S, G, per}).sum(2), pg = p_sum.view({S, G, per}).sum(2);
  return o.device_balance_coef * static_cast<double>(G) * (fg * pg).sum();
}

at::Tensor z_loss_sum(const Routing& r, const MoeOptions& o) {
  return o.z_loss_coef * at::logsumexp(r.logits, -1).pow(2).sum();
}

/// The expert weights packed for packed_gemm: four operands (the two
/// forward products x W1^T and h W2^T, the two row-gradient products
/// g W2 and g' W1), per expert its panels and what they were packed from.
/// An expert's four operands are packed together, each weight's two in
/// one pass over it (packed_gemm::pack_both: a third to a half of the time
/// of packing them one by one), by the first product that needs any of
/// them after they went stale, on the thread running that expert; a pack is
/// stale after the layer's step end (the optimizer has run, or ZeRO has
/// gathered new values into the same storage) and when the weight's
/// storage or version counter (bumped by every in-place write through it)
/// differs from the packed one's. Four copies of each expert's weights:
/// twice the weights' memory.
struct ExpertPacks {
  struct Operand {
    at::Tensor panels;  ///< [E, K x N] fp32
    std::vector<const void*> from;
    std::vector<std::uint32_t> version;

    /// Called before the experts run (one thread): room for E experts.
    void reserve(std::int64_t E, std::int64_t size) {
      if (panels.defined() && panels.size(0) == E && panels.size(1) == size) return;
      panels = at::empty({E, size}, at::kFloat);
      from.assign(static_cast<std::size_t>(E), nullptr);
      version.assign(static_cast<std::size_t>(E), 0);
    }
    float* at(std::int64_t e) { return panels.data_ptr<float>() + e * panels.size(1); }
    bool holds(std::int64_t e, const void* source, std::uint32_t v) const {
      const auto i = static_cast<std::size_t>(e);
      return from[i] == source && version[i] == v;
    }
    void mark(std::int64_t e, const void* source, std::uint32_t v) {
      from[static_cast<std::size_t>(e)] = source;
      version[static_cast<std::size_t>(e)] = v;
    }
  };
  Operand fc1, fc2, fc1_rows, fc2_rows;
  std::mutex in_use;  ///< one forward or backward at a time (a layer's are sequential anyway)

  /// Called before the experts run (one thread): room for E experts of
  /// F x H weights in all four operands.
  void reserve(std::int64_t E, std::int64_t size) {
    for (Operand* o : {&fc1, &fc2, &fc1_rows, &fc2_rows}) o->reserve(E, size);
  }
  /// Expert e's panels of its weight W [R, C] (row-major at w; the weight
  /// `source` at version `v`) as both operands it serves, `direct` (B = W)
  /// and `transposed` (B = W^T): packed together, in one pass over W,
  /// unless both hold this weight already.
  static void pack_pair(Operand& direct, Operand& transposed, std::int64_t e, const float* w,
                        std::int64_t R, std::int64_t C, const void* source, std::uint32_t v) {
    if (direct.holds(e, source, v) && transposed.holds(e, source, v)) return;
    packed_gemm::pack_both(w, R, C, direct.at(e), transposed.at(e));
    direct.mark(e, source, v);
    transposed.mark(e, source, v);
  }
  /// W1[e] [F, H] and W2[e] [H, F]: all four of expert e's operands.
  void pack_expert(std::int64_t e, const float* w1, const float* w2, std::int64_t F, std::int64_t H,
                   const void* s1, std::uint32_t v1, const void* s2, std::uint32_t v2) {
    pack_pair(fc1_rows, fc1, e, w1 + e * F * H, F, H, s1, v1);
    pack_pair(fc2_rows, fc2, e, w2 + e * H * F, H, F, s2, v2);
  }

  void invalidate() {
    std::lock_guard<std::mutex> lock(in_use);
    for (Operand* o : {&fc1, &fc2, &fc1_rows, &fc2_rows})
      std::fill(o->from.begin(), o->from.end(), nullptr);
  }
};

std::shared_ptr<ExpertPacks> make_expert_packs() { return std::make_shared<ExpertPacks>(); }
void mark_stale(ExpertPacks& packs) { packs.invalidate(); }

bool ExpertWeights::packable(const at::Tensor& rows, const at::Tensor& w1, const at::Tensor& w2) {
  return packed_gemm::supported() && rows.scalar_type() == at::kFloat &&
         w1.scalar_type() == at::kFloat && w2.scalar_type() == at::kFloat && w1.is_cpu() &&
         w1.size(1) % packed_gemm::kPanel == 0 && w1.size(2) % packed_gemm::kPanel == 0 &&
         w1.is_contiguous() && w2.is_contiguous();
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// Keeps an ExpertPacks alive in an autograd node's saved data.
struct PacksHolder : torch::CustomClassHolder {
  explicit PacksHolder(std::shared_ptr<ExpertPacks> p) : packs(std::move(p)) {}
  std::shared_ptr<ExpertPacks> packs;
};

/// Experts spread over the intra-op threads, each expert on one thread with
/// single-threaded ops: a 64-row expert matmul is too small to split well
/// (two threads on it mostly wait for each other), two experts at once are
/// not. The experts are handed out one at a time, largest (most rows) first,
/// ties to the lower expert, to whichever thread is free (until session 21
/// fixed bins balanced by rows): an expert's cost is not its rows alone
/// (each product packs the whole weight, whatever the rows), and a thread
/// the machine stalls for a moment no longer holds up a fixed share. Which
/// thread runs an expert does not change its bits: an expert writes only
/// its own rows and its own weight gradients. Autograd is off in the
/// workers (per-thread mode).
template <class F>
void for_each_expert(const std::vector<std::int64_t>& counts, const F& f) {
  const auto n = static_cast<std::int64_t>(counts.size());
  std::vector<std::int64_t> by_rows(static_cast<std::size_t>(n)),
      offset(static_cast<std::size_t>(n), 0);
  for (std::int64_t j = 0; j < n; ++j) {
    by_rows[static_cast<std::size_t>(j)] = j;
    if (j > 0)
      offset[static_cast<std::size_t>(j)] =
          offset[static_cast<std::size_t>(j - 1)] + counts[static_cast<std::size_t>(j - 1)];
  }
  std::stable_sort(by_rows.begin(), by_rows.end(), [&](std::int64_t a, std::int64_t b) {
    return counts[static_cast<std::size_t>(a)] > counts[static_cast<std::size_t>(b)];
  });
  const std::int64_t workers =
      std::max<std::int64_t>(1, std::min<std::int64_t>(at::get_num_threads(), n));
  std::atomic<std::int64_t> next{0};
  at::parallel_for(0, workers, 1, [&](std::int64_t, std::int64_t) {
    c10::NoGradGuard no_grad;
    for (std::int64_t i = next++; i < n; i = next++) {
      const std::int64_t j = by_rows[static_cast<std::size_t>(i)];
      f(j, offset[static_cast<std::size_t>(j)], counts[static_cast<std::size_t>(j)]);
    }
  });
}

/// Every local expert's FFN on its contiguous rows, as one autograd node.
/// Each product is the one autograd would compute for at::linear on the
/// slice (same operands, same layouts: the results are bitwise those of a
/// per-slice linear chain), but the outputs and the row gradients are
/// written into one [M, H] tensor each and the weight gradients straight
/// into [E, F, H]-shaped tensors: no cat of the outputs, no cat of the row
/// gradients, no stack of per-expert weight gradients (the stacks were half
/// of an MoE layer's time at 8 experts x 1024 x 256). Saves the rows, the
/// pre-activation and gelu's output, as autograd does for a dense FFN
/// (recomputing gelu in backward instead saved [M, F] per layer and cost a
/// gelu per expert in every backward).
///
/// When its backward is a Tensor::backward (autograd accumulates into the
/// leaves' .grad) and a weight is a leaf with a plain contiguous .grad, the
/// expert weight gradients are added to that .grad inside the products
/// (beta = 1) and the node hands autograd no weight gradient: the
/// parameter's AccumulateGrad still runs (and its post-hooks, which count
/// gradients for the reductions, fire), with nothing to add. That spares a
/// zero-fill, a write and a read of a temporary and a read-add-write pass
/// per weight (four passes over [E, F, H] per micro-batch), which at 64
/// rows per expert cost as much as a sixth of the product itself. Bitwise
/// as autograd's sum when an expert's rows fit one BLAS k-block (OpenBLAS's
/// Haswell kernels: up to 320 rows, measured); else the blocks' partial
/// sums are added to .grad one by one (rounded differently, still
/// deterministic). With packed weights on a CPU with AVX-512F the weight
/// gradients are packed_gemm's instead (WeightGrad::packed_product: FMA
/// chains over blocks of 256 rows, each block's sum added to .grad): not
/// BLAS's rounding, so a run on such a CPU and one without AVX-512F differ
/// in the last bits of these gradients (within 1e-6 per tensor, as packed
/// and slices do). Under autograd::grad (or backward with `inputs`) the
/// gradients are returned as before.
struct GroupedFfn : torch::autograd::Function<GroupedFfn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rows, const at::Tensor& w1,
                            const at::Tensor& b1, const at::Tensor& w2, const at::Tensor& b2,
                            std::vector<std::int64_t> counts, std::shared_ptr<ExpertPacks> packs) {
    profile::Span span("compute", "moe.experts");
    const std::int64_t M = rows.size(0), H = rows.size(1), F = w1.size(1), E = w1.size(0);
    span.arg("rows", M);  // the rank's expert load (bench/moe_rank_load.py)
    at::Tensor x = rows.contiguous();
    at::Tensor pre = at::empty({M, F}, x.options());
    at::Tensor act = at::empty({M, F}, x.options());
    at::Tensor out = at::empty({M, H}, x.options());
    if (packs) {
      std::lock_guard<std::mutex> lock(packs->in_use);
      packs->reserve(E, F * H);
      const void *s1 = w1.data_ptr(), *s2 = w2.data_ptr();
      const std::uint32_t v1 = w1._version(), v2 = w2._version();
      const float *W1 = w1.data_ptr<float>(), *W2 = w2.data_ptr<float>();
      const at::Tensor b1c = b1.contiguous(), b2c = b2.contiguous();
      const float *B1 = b1c.data_ptr<float>(), *B2 = b2c.data_ptr<float>();
      const float* X = x.data_ptr<float>();
      float *P = pre.data_ptr<float>(), *A = act.data_ptr<float>(), *O = out.data_ptr<float>();
      for_each_expert(counts, [&](std::int64_t e, std::int64_t off, std::int64_t m) {
        if (m == 0) return;
        // x W1^T: B (k, n) = W1[e][n][k]; h W2^T: B (k, n) = W2[e][n][k].
        packs->pack_expert(e, W1, W2, F, H, s1, v1, s2, v2);
        const float *p1 = packs->fc1.at(e), *p2 = packs->fc2.at(e);
        packed_gemm::product(m, H, F, X + off * H, H, p1, B1 + e * F, P + off * F, F);
        at::Tensor h = act.narrow(0, off, m);
        at::gelu_out(h, pre.narrow(0, off, m));
        packed_gemm::product(m, F, H, A + off * F, F, p2, B2 + e * H, O + off * H, H);
      });
      ctx->saved_data["packs"] = c10::IValue::make_capsule(c10::make_intrusive<PacksHolder>(packs));
    } else {
      for_each_expert(counts, [&](std::int64_t e, std::int64_t off, std::int64_t m) {
        if (m == 0) return;
        at::Tensor p = pre.narrow(0, off, m), h = act.narrow(0, off, m), o = out.narrow(0, off, m);
        at::addmm_out(p, b1[e], x.narrow(0, off, m), w1[e].t());
        at::gelu_out(h, p);
        at::addmm_out(o, b2[e], h, w2[e].t());
      });
    }
    ctx->save_for_backward({x, w1, w2, pre, act});
    ctx->saved_data["counts"] = c10::IValue(counts);
    // Zero-bubble schedules (weight_grad.h): the backward may run B here
    // and queue W, which needs the biases too.
    // (A Function's forward runs with gradient mode off: not asked here.)
    if (wgrad::splitting() && w1.requires_grad() && w1.is_leaf() && w2.is_leaf()) {
      ctx->saved_data["b1"] = b1;
      ctx->saved_data["b2"] = b2;
    }
    // The parameters themselves (not a saved copy's handle): their .grad.
    ctx->saved_data["w1"] = w1;
    ctx->saved_data["w2"] = w2;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    profile::Span span("compute", "moe.experts.backward");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w1 = saved[1], &w2 = saved[2], &pre = saved[3], &act = saved[4];
    span.arg("rows", x.size(0));
    const auto counts = ctx->saved_data["counts"].toIntVector();
    const at::Tensor gy = grads[0].contiguous();
    // The row-gradient products g W2 and g' W1 through packed_gemm when
    // the forward used it.
    std::shared_ptr<ExpertPacks> packs;
    if (ctx->saved_data.count("packs"))
      packs = c10::static_intrusive_pointer_cast<PacksHolder>(ctx->saved_data["packs"].toCapsule())->packs;
    // The weight gradients through packed_gemm as well where it runs its
    // AVX-512 kernel (1.6-1.9 x BLAS there; HP_PACKED_GEMM_KERNEL=avx2 turns
    // that off on an AVX-512 CPU); its AVX2 kernel reads a^T
    // slower than BLAS does, so without AVX-512F they stay with BLAS.
    const bool packed_grads = packs && packed_gemm::best_kernel() == packed_gemm::Kernel::kAvx512;
    at::Tensor gx = at::empty_like(x), gp = at::empty({x.size(0), w1.size(1)}, x.options());
    input_grads(counts, gy, pre, w1, w2, packs, gx, gp);
    const at::Tensor pw1 = ctx->saved_data["w1"].toTensor(), pw2 = ctx->saved_data["w2"].toTensor();
    if (ctx->saved_data.count("b1") && wgrad::collecting()) {
      // B of a zero-bubble schedule ends here; W (the weights' and biases'
      // gradients from the same g, h, g' and x, summed into .grad as below
      // and as autograd sums the biases) is queued.
      const at::Tensor pb1 = ctx->saved_data["b1"].toTensor(), pb2 = ctx->saved_data["b2"].toTensor();
      wgrad::WeightGradItem item;
      item.grad_out = gy;
      item.input = x;
      item.weight = pw1;
      item.bias = pb1;
      item.also = {pw2, pb2};
      item.apply = [gy, x, act, gp, counts, pw1, pw2, pb1, pb2, packed_grads] {
        auto g = weight_grads(counts, gy, x, act, gp, pw1, pw2, true, packed_grads);
        for (auto& [param, grad] : {std::pair{pw1, g[0]}, std::pair{pb1, g[1]}, std::pair{pw2, g[2]},
                                    std::pair{pb2, g[3]}}) {
          if (!grad.defined()) continue;  // summed into .grad already
          at::Tensor& held = const_cast<at::Tensor&>(param).mutable_grad();
          if (held.defined()) {
            held.add_(grad);
          } else {
            held = grad;
          }
        }
      };
      wgrad::defer(std::move(item));
      return {gx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    }
    const auto* exec = torch::autograd::get_current_graph_task_exec_info();
    const bool into_grad = exec && exec->empty();  // Tensor::backward: leaves accumulate
    auto g = weight_grads(counts, gy, x, act, gp, pw1, pw2, into_grad, packed_grads);
    return {gx, g[0], g[1], g[2], g[3], at::Tensor(), at::Tensor()};
  }

  /// The rows' gradients: per expert, dh = g w2, g' = gelu's backward
  /// (into `gp`, which W reads), dx = g' w1 (into `gx`).
  static void input_grads(const std::vector<std::int64_t>& counts, const at::Tensor& gy, const at::Tensor& pre,
                          const at::Tensor& w1, const at::Tensor& w2, const std::shared_ptr<ExpertPacks>& packs,
                          at::Tensor& gx, at::Tensor& gp) {
    const std::int64_t E = w1.size(0), F = w1.size(1), H = w1.size(2);
    const void *s1 = w1.data_ptr(), *s2 = w2.data_ptr();
    const std::uint32_t v1 = w1._version(), v2 = w2._version();
    std::unique_lock<std::mutex> lock;
    at::Tensor gh;
    if (packs) {
      lock = std::unique_lock<std::mutex>(packs->in_use);
      packs->reserve(E, F * H);
      gh = at::empty({gy.size(0), F}, gy.options());
    }
    for_each_expert(counts, [&](std::int64_t e, std::int64_t off, std::int64_t m) {
      if (m == 0) return;
      at::Tensor g = gy.narrow(0, off, m), p = pre.narrow(0, off, m), dx = gx.narrow(0, off, m);
      at::Tensor dh;
      if (packs) {
        // B = W2[e] [H, F] and W1[e] [F, H] as they are (row-major).
        dh = gh.narrow(0, off, m);
        packs->pack_expert(e, w1.data_ptr<float>(), w2.data_ptr<float>(), F, H, s1, v1, s2, v2);
        packed_gemm::product(m, H, F, g.data_ptr<float>(), H, packs->fc2_rows.at(e), nullptr,
                             dh.data_ptr<float>(), F);
      } else {
        dh = g.mm(w2[e]);
      }
      at::Tensor gpe = gp.narrow(0, off, m);
      at::gelu_backward_out(gpe, dh, p);
      if (packs) {
        packed_gemm::product(m, F, H, gpe.data_ptr<float>(), F, packs->fc1_rows.at(e), nullptr,
                             dx.data_ptr<float>(), H);
      } else {
        at::mm_out(dx, gpe, w1[e]);
      }
    });
  }

  /// The weights' and biases' gradients: y = h w2^T + b2 gives dW2 = g^T h
  /// and db2 = g's rows summed; p = x w1^T + b1 gives dW1 = g'^T x and db1.
  /// {dW1, db1, dW2, db2}; a weight's is undefined when summed into its
  /// .grad (WeightGrad); an expert without rows gets zeros, as autograd.
  static std::array<at::Tensor, 4> weight_grads(const std::vector<std::int64_t>& counts, const at::Tensor& gy,
                                                const at::Tensor& x, const at::Tensor& act, const at::Tensor& gp,
                                                const at::Tensor& pw1, const at::Tensor& pw2, bool into_grad,
                                                bool packed_grads) {
    WeightGrad gw1(pw1, into_grad), gw2(pw2, into_grad);
    at::Tensor gb1 = at::empty({pw1.size(0), pw1.size(1)}, pw1.options());
    at::Tensor gb2 = at::empty({pw2.size(0), pw2.size(1)}, pw2.options());
    for_each_expert(counts, [&](std::int64_t e, std::int64_t off, std::int64_t m) {
      at::Tensor db1 = gb1[e], db2 = gb2[e];
      if (m == 0) {
        gw1.zero(e);
        db1.zero_();
        gw2.zero(e);
        db2.zero_();
        return;
      }
      at::Tensor g = gy.narrow(0, off, m), h = act.narrow(0, off, m), gpe = gp.narrow(0, off, m);
      at::Tensor xi = x.narrow(0, off, m);
      if (packed_grads)
        gw2.packed_product(e, g, h);
      else
        gw2.product(e, g.t(), h);
      at::sum_out(db2, g, 0);
      if (packed_grads)
        gw1.packed_product(e, gpe, xi);
      else
        gw1.product(e, gpe.t(), xi);
      at::sum_out(db1, gpe, 0);
    });
    return {gw1.result(), gb1, gw2.result(), gb2};
  }

 private:
  /// One weight's gradient: added into the parameter's .grad (see above),
  /// written into a fresh .grad when it has none, or (not accumulating, or
  /// a .grad of another layout) written into a new tensor returned to
  /// autograd.
  class WeightGrad {
   public:
    WeightGrad(const at::Tensor& param, bool into_grad) : param_(param) {
      const at::Tensor& held = param.grad();
      into_ = into_grad && param.is_leaf() && param.requires_grad();
      add_ = into_ && held.defined() && held.sizes() == param.sizes() && held.is_contiguous() &&
             held.scalar_type() == param.scalar_type() && held.layout() == at::kStrided &&
             held.device() == param.device();
      if (into_ && held.defined() && !add_) into_ = false;
      grad_ = add_ ? held : at::empty_like(param, at::MemoryFormat::Contiguous);
    }
    /// Expert e's gradient a b (added to what is there when adding).
    void product(std::int64_t e, const at::Tensor& a, const at::Tensor& b) {
      at::Tensor d = grad_[e];
      if (add_)
        d.addmm_(a, b);
      else
        at::mm_out(d, a, b);
    }
    /// Expert e's gradient a^T b through packed_gemm (a [m, R] and b
    /// [m, C] contiguous rows; grad[e] is [R, C]): b packed into panels on
    /// this thread's scratch, a read transposed, the products added to
    /// grad[e] (zeroed first when not adding). Its k is the expert's rows:
    /// summed in blocks of 256 rows by FMA chains, not BLAS's rounding.
    void packed_product(std::int64_t e, const at::Tensor& a, const at::Tensor& b) {
      const std::int64_t m = a.size(0), R = a.size(1), C = b.size(1);
      const at::Tensor ac = a.contiguous(), bc = b.contiguous();  // rows R and C apart
      at::Tensor d = grad_[e];
      if (!add_) d.zero_();
      thread_local std::vector<float> panels;
      panels.resize(static_cast<std::size_t>(packed_gemm::packed_size(m, C)));
      packed_gemm::pack(bc.data_ptr<float>(), m, C, C, 1, panels.data());
      packed_gemm::product_add(R, m, C, ac.data_ptr<float>(), 1, R, panels.data(), d.data_ptr<float>(), C);
    }
    void zero(std::int64_t e) {
      if (!add_) grad_[e].zero_();
    }
    /// What the node returns for this weight (undefined: already in .grad).
    at::Tensor result() {
      if (!into_) return grad_;
      if (!add_) const_cast<at::Tensor&>(param_).mutable_grad() = grad_;
      return at::Tensor();
    }

   private:
    at::Tensor param_, grad_;
    bool into_ = false, add_ = false;
  };
};

}  // namespace

at::Tensor ExpertWeights::hidden(std::int64_t e, const at::Tensor& x) const {
  if (w3.defined()) return at::silu(precision::linear(x, w3[e], {})) * precision::linear(x, w1[e], {});
  return at::gelu(precision::linear(x, w1[e], b1.defined() ? b1[e] : at::Tensor()));
}

at::Tensor ExpertWeights::forward(std::int64_t e, const at::Tensor& x) const {
  return precision::linear(hidden(e, x), w2[e], b2.defined() ? b2[e] : at::Tensor());
}

at::Tensor ExpertWeights::forward_grouped(const at::Tensor& rows,
                                          const std::vector<std::int64_t>& counts,
                                          ExpertCompute how) const {
  const auto n = static_cast<std::int64_t>(counts.size());
  const std::int64_t most = counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end());
  // rows x 0 for no rows keeps the graph connected to `rows` (expert
  // parallel needs every rank's backward to reach its exchanges).
  if (most == 0) return rows * 0;
  if (rows.scalar_type() != w1.scalar_type() || w3.defined()) {
    // Mixed precision, and SwiGLU experts: each expert's rows through the
    // library's products in the rows' type (precision::linear: ATen's bf16
    // product, or the fp32 BLAS on bf16 operands), the weights cut by unbind
    // (one gradient node for the stack, not one per expert) and cast by the
    // product.
    auto cut = [n](const at::Tensor& t) {
      return t.defined() ? t.unbind(0) : std::vector<at::Tensor>(static_cast<std::size_t>(n));
    };
    const auto W1 = cut(w1), B1 = cut(b1), W2 = cut(w2), B2 = cut(b2), W3 = cut(w3);
    std::vector<at::Tensor> outs;
    std::int64_t off = 0;
    for (std::int64_t e = 0; e < n; ++e) {
      const std::int64_t m = counts[static_cast<std::size_t>(e)];
      if (m == 0) continue;
      const auto i = static_cast<std::size_t>(e);
      const at::Tensor x = rows.narrow(0, off, m);
      const at::Tensor h = W3[i].defined()
                               ? at::silu(precision::linear(x, W3[i], {})) * precision::linear(x, W1[i], {})
                               : at::gelu(precision::linear(x, W1[i], B1[i]));
      outs.push_back(precision::linear(h, W2[i], B2[i]));
      off += m;
    }
    return at::cat(outs);
  }
  if (how == ExpertCompute::kPacked && packable(rows, w1, w2))
    return GroupedFfn::apply(rows, w1, b1, w2, b2, counts,
                             packs ? packs : std::make_shared<ExpertPacks>());
  if (how != ExpertCompute::kPadded)
    return GroupedFfn::apply(rows, w1, b1, w2, b2, counts, std::shared_ptr<ExpertPacks>());
  // Row i of expert j goes to slot j x most + i of [n, most, H].
  at::Tensor c = at::tensor(counts, at::kLong);
  at::Tensor start = c.cumsum(0) - c;
  at::Tensor expert_of = at::repeat_interleave(at::arange(n, at::kLong), c);
  at::Tensor slot =
      expert_of * most + at::arange(rows.size(0), at::kLong) - start.index_select(0, expert_of);
  const std::int64_t H = rows.size(1);
  at::Tensor x =
      at::zeros({n * most, H}, rows.options()).index_copy(0, slot, rows).view({n, most, H});
  at::Tensor h = at::gelu(at::baddbmm(b1.unsqueeze(1), x, w1.transpose(1, 2)));
  at::Tensor y = at::baddbmm(b2.unsqueeze(1), h, w2.transpose(1, 2));
  return y.view({n * most, H}).index_select(0, slot);
}

ExpertGroups group_by_expert(const Routing& r, std::int64_t first, std::int64_t count) {
  const std::int64_t N = r.experts.size(0), k = r.experts.size(1);
  at::Tensor flat_e = r.experts.reshape({-1});
  at::Tensor mine = r.kept.reshape({-1});
  if (first > 0 || count < r.probs.size(1)) {
    mine = mine.logical_and(flat_e.ge(first)).logical_and(flat_e.lt(first + count));
  }
  at::Tensor slots = at::nonzero(mine).reshape({-1});  // ascending: by token, then slot
  at::Tensor local = flat_e.index_select(0, slots) - first;
  ExpertGroups g;
  g.order = slots.index_select(0, std::get<1>(at::sort(local, /*stable=*/true, /*dim=*/0, false)));
  at::Tensor c = at::bincount(local, {}, count).to(at::kLong).contiguous();
  g.counts.assign(c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + count);
  const std::int64_t M = g.order.size(0);
  g.token_of = at::div(g.order, k, "floor");
  g.slot_row = at::full({N * k}, M, at::kLong)
                   .index_copy_(0, g.order, at::arange(M, at::kLong))
                   .view({N, k});
  return g;
}

namespace {

/// Token t's rows summed in slot order, [N, H]: slot 0's row plus the
/// others' in order (a sum from zero without the zero: 0 + x is x); a slot
/// with no row (slot_row = M) reads an appended zero row.
at::Tensor sum_slots(const at::Tensor& rows, const at::Tensor& slot_row) {
  const std::int64_t N = slot_row.size(0), k = slot_row.size(1), M = rows.size(0);
  const at::Tensor src =
      N * k == M ? rows : at::cat({rows, at::zeros({1, rows.size(1)}, rows.options())});
  at::Tensor out = src.index_select(0, slot_row.select(1, 0));
  for (std::int64_t j = 1; j < k; ++j) out = out + src.index_select(0, slot_row.select(1, j));
  return out;
}

/// A row map whose backward is another: each is a gather by a 1-D index,
/// or by a 2-D [N, k] slot index a gather and sum over the slots.
at::Tensor map_rows(const at::Tensor& x, const at::Tensor& index) {
  return index.dim() == 2 ? sum_slots(x, index) : x.index_select(0, index);
}

struct RowMap : torch::autograd::Function<RowMap> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& index,
                            const at::Tensor& backward_index) {
    ctx->saved_data["backward_index"] = backward_index;
    return map_rows(x, index);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {map_rows(grads[0].contiguous(), ctx->saved_data["backward_index"].toTensor()),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor rows_by_expert(const at::Tensor& tokens, const ExpertGroups& g) {
  return RowMap::apply(tokens, g.token_of, g.slot_row);
}

at::Tensor combine_by_token(const at::Tensor& rows, const ExpertGroups& g) {
  return RowMap::apply(rows, g.slot_row, g.token_of);
}

at::Tensor permute_rows(const at::Tensor& x, const at::Tensor& perm, const at::Tensor& inverse) {
  return RowMap::apply(x, perm, inverse);
}

at::Tensor dispatch_locally(const ExpertWeights& w, std::int64_t first_expert,
                            const at::Tensor& tokens, const Routing& r, ExpertCompute how) {
  ExpertGroups g = group_by_expert(r, first_expert, w.w1.size(0));
  return combine_weighted(w.forward_grouped(rows_by_expert(tokens, g), g.counts, how), r, g);
}

at::Tensor combine_weighted(const at::Tensor& rows, const Routing& r, const ExpertGroups& g) {
  at::Tensor weight = r.weights.reshape({-1}).index_select(0, g.order).unsqueeze(1);
  if (rows.scalar_type() == at::kFloat) return combine_by_token(rows * weight.to(rows.scalar_type()), g);
  return combine_by_token(precision::cast(rows, at::kFloat) * precision::cast(weight, at::kFloat), g)
      .to(rows.scalar_type());
}

MoeLayer::MoeLayer(const LayerSpec& s, BuildContext& ctx)
    : name_(s.name), hidden_(s.in), ffn_(s.out), init_std_(s.init_std), swiglu_(s.activation == "swiglu") {
  if (s.activation != "gelu" && s.activation != "swiglu") {
    throw std::invalid_argument("model error: '" + s.name + "': expert activation '" + s.activation +
                                "' is unknown (legal: gelu, swiglu)");
  }
  if (!s.moe)
    throw std::logic_error("internal error: moe layer '" + s.name +
                           "' built without options, please report");
  o_ = *s.moe;
  layout_ = ctx.sequence_layout();
  const std::int64_t E = o_.num_experts;
  router_ =
      ctx.param(*this, s.name + ".router.weight", "router", {E, hidden_}, Init::normal(s.init_std));
  if (o_.bias_update_rate > 0)
    bias_ = ctx.buffer(*this, s.name + ".router.bias", "router_bias", {E});
  if (o_.shared_experts > 0) {
    LayerSpec m{"mlp", s.name + ".shared", hidden_, o_.shared_experts * ffn_};
    m.with_init_std(s.init_std).with_bias(s.bias);
    m.activation = s.activation;
    shared_ = register_module("shared", ctx.layers().make(m, ctx));
  }
  stats_.tokens_per_expert.assign(static_cast<std::size_t>(E), 0.0);
  // After each optimizer step: the global counts (summed over the replicas,
  // which saw different data), the aux-free bias update, the figures.
  ctx.on_step_end([this](StepContext& sc) {
    at::Tensor counts = at::tensor(stats_.tokens_per_expert, at::kDouble);
    at::Tensor more = at::tensor({stats_.selected, stats_.dropped}, at::kDouble);
    auto& replicas = sc.dist->group(dist::MeshRole::kReplicate);
    replicas.all_reduce(counts);
    replicas.all_reduce(more);
    if (layout_) {  // ranks holding the other positions of the same sequences
      layout_->sum(counts);
      layout_->sum(more);
    }
    const double total = counts.sum().item<double>();
    const double mean = total / static_cast<double>(o_.num_experts);
    const double imbalance = mean > 0 ? counts.max().item<double>() / mean : 0.0;
    const double dropped =
        more[0].item<double>() > 0 ? more[1].item<double>() / more[0].item<double>() : 0.0;
    if (bias_.defined() && total > 0) {
      c10::NoGradGuard g;
      bias_.add_(at::sign(mean - counts).to(bias_.scalar_type()) * o_.bias_update_rate);
    }
    if (sc.metrics) {
      counts = counts.contiguous();
      const double* c = counts.data_ptr<double>();
      for (std::int64_t e = 0; e < o_.num_experts; ++e) {
        sc.metrics
            ->gauge("hp_moe_tokens_per_expert",
                    "Token assignments an expert kept in the last step, global batch.",
                    {{"layer", name_}, {"expert", std::to_string(e)}})
            .set(c[e]);
      }
      sc.metrics
          ->gauge("hp_moe_load_imbalance",
                  "Max over mean of the tokens per expert in the last step.", {{"layer", name_}})
          .set(imbalance);
      sc.metrics
          ->gauge("hp_moe_dropped_fraction",
                  "Share of token assignments capacity dropped in the last step.",
                  {{"layer", name_}})
          .set(dropped);
    }
    if (sc.figures) {
      auto& fig = *sc.figures;
      fig["moe_load_imbalance_max"] = std::max(
          fig.count("moe_load_imbalance_max") ? fig["moe_load_imbalance_max"] : 0.0, imbalance);
      fig["moe_dropped_fraction_max"] = std::max(
          fig.count("moe_dropped_fraction_max") ? fig["moe_dropped_fraction_max"] : 0.0, dropped);
    }
    std::fill(stats_.tokens_per_expert.begin(), stats_.tokens_per_expert.end(), 0.0);
    stats_.selected = stats_.dropped = 0;
  });
}

ExpertWeights MoeLayer::make_experts(BuildContext& ctx, const dist::Placements& placements,
                                     const std::string& ffn_dim) {
  const std::int64_t E = o_.num_experts, H = hidden_, F = ffn_;
  // split_at: the dimension the FFN split cuts (-1: none).
  auto make = [&](const std::string& what, std::vector<std::int64_t> shape, Init init, int split_at) {
    std::string local = "experts_" + what;
    std::replace(local.begin(), local.end(), '.', '_');
    dist::Placements p = placements;
    if (!ffn_dim.empty() && split_at >= 0) p.push_back({ffn_dim, dist::Placement::shard(split_at)});
    return ctx.param(*this, name_ + ".experts." + what, local, shape, init, p);
  };
  ExpertWeights w;
  if (swiglu_) {
    w.w3 = make("gate.weight", {E, F, H}, Init::normal(init_std_), 1);
    w.w1 = make("up.weight", {E, F, H}, Init::normal(init_std_), 1);
    w.w2 = make("down.weight", {E, H, F}, Init::normal(init_std_), 2);
    return w;  // no biases; always the library's products (no packs)
  }
  w.w1 = make("fc1.weight", {E, F, H}, Init::normal(init_std_), 1);
  w.b1 = make("fc1.bias", {E, F}, Init::zeros(), 1);
  w.w2 = make("fc2.weight", {E, H, F}, Init::normal(init_std_), 2);
  w.b2 = make("fc2.bias", {E, H}, Init::zeros(), -1);
  if (o_.compute == ExpertCompute::kPacked && !packed_gemm::supported()) {
    static std::once_flag said;
    std::call_once(said, [] {
      log::logger()->info(
          "model.moe.expert_compute: packed needs a CPU with AVX2 and FMA, which this one lacks; "
          "the experts run through BLAS (as slices), with the same results up to float rounding");
    });
  }
  if (o_.compute == ExpertCompute::kPacked) {
    // Where the products will run packed (fp32 rows, sizes of whole
    // panels, a CPU with the kernel), the packs hold each weight twice.
    const bool packed = packed_gemm::supported() && !ctx.precision().mixed() &&
                        w.w1.size(1) % packed_gemm::kPanel == 0 && w.w1.size(2) % packed_gemm::kPanel == 0;
    if (packed) {
      ctx.mark_kept_copies(w.w1, 2);
      ctx.mark_kept_copies(w.w2, 2);
    }
    w.packs = std::make_shared<ExpertPacks>();
    // The optimizer has changed the weights (or ZeRO gathered new values
    // into the same storage): pack again at the next forward.
    ctx.on_step_end([packs = w.packs](StepContext&) { packs->invalidate(); });
  }
  return w;
}

at::Tensor MoeLayer::forward(const at::Tensor& x) {
  const auto shape = x.sizes().vec();
  const std::int64_t seq = x.size(1);
  at::Tensor tokens = x.reshape({-1, hidden_});
  profile::Span route_span("compute", "moe.route");
  // The router runs in fp32 whatever the stream's type (its decisions and
  // the balancing losses are fp32 statistics; a no-op cast for fp32).
  Routing r = route(at::linear(precision::cast(tokens, at::kFloat), router_), bias_, o_, seq, layout_.get());
  if (aux_loss_collecting()) {
    if (o_.aux_loss_coef > 0)
      add_aux_loss("load_balance", load_balance_loss_sum(r, o_, seq, layout_.get()));
    if (o_.device_balance_coef > 0)
      add_aux_loss("device_balance", device_balance_loss_sum(r, o_, seq, layout_.get()));
    if (o_.z_loss_coef > 0) add_aux_loss("router_z", z_loss_sum(r, o_));
  }
  if (aux_loss_collecting() && !aux_loss_replaying()) {
    // Counted once per forward of a step (not again when recompute replays it).
    at::Tensor kept_e = r.experts.masked_select(r.kept);
    at::Tensor counts = at::bincount(kept_e, {}, o_.num_experts).to(at::kDouble).contiguous();
    const double* c = counts.data_ptr<double>();
    for (std::int64_t e = 0; e < o_.num_experts; ++e)
      stats_.tokens_per_expert[static_cast<std::size_t>(e)] += c[e];
    stats_.selected += static_cast<double>(r.kept.numel());
    stats_.dropped += static_cast<double>(r.kept.numel() - kept_e.numel());
  }
  if (tensor_dump::recording(tensor_dump::kRouting)) {
    // Per token of the micro-batch ([samples x local positions] rows): the
    // inputs of every decision and the decisions, with the tokens' global
    // positions (a rank of a sequence layout holds pieces of each sequence).
    tensor_dump::record(name_, "logits", r.logits);
    tensor_dump::record(name_, "probs", r.probs);
    tensor_dump::record(name_, "scores", bias_.defined() ? r.probs.detach() + bias_ : r.probs);
    tensor_dump::record(name_, "experts", r.experts);
    tensor_dump::record(name_, "kept", r.kept);
    tensor_dump::record(name_, "positions",
                        layout_ ? piece_positions(layout_->local_pieces(seq)) : at::arange(seq, at::kLong));
  }
  route_span.end();
  profile::Span dispatch_span("compute", "moe.dispatch");
  at::Tensor out = dispatch(tokens, r).view(shape);
  if (shared_) out = out + shared_->forward(x);
  return out;
}

namespace {

class DenseMoe : public MoeLayer {
 public:
  DenseMoe(const LayerSpec& s, BuildContext& ctx) : MoeLayer(s, ctx) {
    experts_ = make_experts(ctx);
  }

 protected:
  at::Tensor dispatch(const at::Tensor& tokens, const Routing& r) override {
    return dispatch_locally(experts_, 0, tokens, r, options().compute);
  }

 private:
  ExpertWeights experts_;
};

}  // namespace

std::shared_ptr<Layer> make_dense_moe(const LayerSpec& spec, BuildContext& ctx) {
  return std::make_shared<DenseMoe>(spec, ctx);
}

}  // namespace hp
