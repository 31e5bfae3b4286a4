#pragma once
// Mixture of experts, defined so that every layout computes the same
// numbers (docs/moe.md): the router, the capacity rule and the
// auxiliary losses work per sequence, ties are broken by the lower expert
// index (and the earlier token), and a token's expert outputs are summed in
// ascending expert order. The dense `moe` layer kind (every expert on this
// rank) lives here; expert_parallel replaces its dispatch.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hp/model/layers.h"

namespace hp {

class Config;
class ConfigErrors;
class Schema;

/// How a rank runs its experts on the rows sorted by expert
/// (model.moe.expert_compute): each expert's FFN on its contiguous slice
/// through BLAS (kSlices) or through packed_gemm on weights packed once per
/// step (kPacked; as kSlices where packed_gemm cannot run), or all experts
/// in one batched product over zero-padded rows (kPadded).
enum class ExpertCompute { kSlices, kPacked, kPadded };

/// model.moe.*, read once.
struct MoeOptions {
  std::int64_t num_experts = 0;  ///< 0: no MoE
  std::int64_t top_k = 2;
  std::int64_t every = 1;       ///< block i is MoE when i % every == 0
  std::int64_t ffn_hidden = 0;  ///< an expert's FFN width; 0: the model's FFN width
  std::int64_t shared_experts = 0;
  bool sigmoid = false;          ///< score function: softmax (false) or sigmoid
  bool renormalize = true;       ///< divide the k weights by their sum
  double capacity_factor = 0.0;  ///< 0: dropless
  double aux_loss_coef = 0.01;
  double device_balance_coef = 0.0;  ///< the group-level balance loss; 0: off
  std::int64_t device_groups = 1;    ///< consecutive expert groups it balances
  double z_loss_coef = 0.0;
  double bias_update_rate = 0.0;  ///< aux-loss-free balancing; 0: off
  ExpertCompute compute = ExpertCompute::kPacked;  ///< model.moe.expert_compute
  static MoeOptions from(const Config& c);
  bool enabled() const { return num_experts > 0; }
  /// Slots per expert and sequence of `seq` tokens (capacity_factor > 0).
  std::int64_t capacity(std::int64_t seq) const;
};

/// Declares model.moe.* (the gpt and mlp models call it).
void declare_moe_options(Schema& s);
/// Rules among model.moe.*: top_k <= num_experts, ... (config errors).
void validate_moe_options(const Config& c, ConfigErrors& e);

/// The routing of N tokens (N a multiple of the sequence length).
struct Routing {
  at::Tensor logits;   ///< [N, E] fp32 router scores before the score function
  at::Tensor probs;    ///< [N, E] softmax or sigmoid of the logits (differentiable)
  at::Tensor experts;  ///< [N, k] int64, ascending within each token
  at::Tensor weights;  ///< [N, k] (differentiable); 0 where the assignment was dropped
  at::Tensor kept;     ///< [N, k] bool: false where capacity dropped the assignment
};

/// Top-k of probs + bias (bias: selection only; undefined for none), ties
/// to the lower expert index; weights from probs, renormalised when asked;
/// capacity per sequence of `seq` tokens: each expert keeps the
/// assignments with the highest probability, ties to the earlier token.
/// Under a sequence layout (`layout` non-null: this rank holds pieces of
/// each sequence), `seq` is the local length and capacity ranks the
/// assignments of the whole sequence, gathered from the ranks holding it.
Routing route(const at::Tensor& logits, const at::Tensor& bias, const MoeOptions& o,
              std::int64_t seq, const SequenceLayout* layout = nullptr);

/// Load-balancing loss as a SUM over the sequences of aux_coef * E *
/// sum_e f_e * P_e times the sequence length (so dividing by the global
/// token count gives the mean over sequences). f_e counts the top-k
/// selections (before capacity); the gradient flows through P_e only.
/// Under a sequence layout f_e counts the whole sequence (summed over the
/// ranks holding it) and the sum covers this rank's positions: the terms of
/// those ranks add up to the sequence's loss.
at::Tensor load_balance_loss_sum(const Routing& r, const MoeOptions& o, std::int64_t seq,
                                 const SequenceLayout* layout = nullptr);
/// Device-level balance loss (DeepSeek-V2's, per sequence as above): the
/// experts split into G = device_groups consecutive groups (expert parallel
/// at size G holds group g on ep rank g), f'_g the group's share of the
/// selections and P'_g its summed mean probability; per sequence
/// device_balance_coef * G * sum_g f'_g * P'_g (1 x the coefficient when
/// balanced), returned as load_balance_loss_sum's is: a SUM over the
/// tokens. Gradient through P'_g only.
at::Tensor device_balance_loss_sum(const Routing& r, const MoeOptions& o, std::int64_t seq,
                                   const SequenceLayout* layout = nullptr);
/// Router z-loss as a SUM over tokens of z_coef * logsumexp(logits)^2.
at::Tensor z_loss_sum(const Routing& r, const MoeOptions& o);

/// Packed expert weights (ExpertCompute::kPacked), defined in moe.cpp.
struct ExpertPacks;
std::shared_ptr<ExpertPacks> make_expert_packs();
/// Marks every pack stale: the next product packs its weight again. The
/// layer calls it at each step end; call it after changing expert weights
/// without going through their version counter (a write into their storage
/// through another tensor).
void mark_stale(ExpertPacks& packs);

/// Expert parameters stacked per layer: w1 [E, F, H], b1 [E, F],
/// w2 [E, H, F], b2 [E, H] (a slice of experts on expert-parallel ranks).
/// SwiGLU experts (LayerSpec::activation "swiglu") have w3 [E, F], the
/// gate, with w1 the up and w2 the down projection, and no biases (b1, b2
/// undefined); they always run through the library's products (kSlices).
struct ExpertWeights {
  at::Tensor w1, b1, w2, b2;
  at::Tensor w3;  ///< SwiGLU's gate; undefined for GELU experts
  /// The activation before the down projection of local expert e:
  /// gelu(x w1[e]^T + b1[e]), or silu(x w3[e]^T) * (x w1[e]^T).
  at::Tensor hidden(std::int64_t e, const at::Tensor& x) const;
  /// kPacked's panels, reused until the layer's step end (MoeLayer::
  /// make_experts sets that up) or until a weight changes; null: packed
  /// afresh for each call.
  std::shared_ptr<ExpertPacks> packs;
  /// hidden(e, x) w2[e]^T + b2[e] for local expert e.
  at::Tensor forward(std::int64_t e, const at::Tensor& x) const;
  /// Rows grouped by local expert (the first counts[0] rows for expert 0,
  /// the next counts[1] for expert 1, ...): every expert's FFN on its
  /// contiguous slice (kSlices, kPacked), or all experts at once with a
  /// batched matmul over [experts, max count, H] with zero rows as padding
  /// (kPadded). [M, H] in the order of `rows`.
  at::Tensor forward_grouped(const at::Tensor& rows, const std::vector<std::int64_t>& counts,
                             ExpertCompute how) const;
  /// Whether kPacked runs packed_gemm for these weights and rows (else it
  /// runs as kSlices): an AVX2 + FMA CPU, fp32, widths multiples of 16.
  static bool packable(const at::Tensor& rows, const at::Tensor& w1, const at::Tensor& w2);
};

/// The kept assignments of experts [first, first + count) grouped by
/// expert: one stable sort of the flat assignment indices (token x k +
/// slot) by expert, so that tokens stay ascending within an expert.
struct ExpertGroups {
  at::Tensor order;                  ///< [M] int64 flat assignment indices, by expert then token
  std::vector<std::int64_t> counts;  ///< assignments per local expert (sum M)
  at::Tensor token_of;               ///< [M] the token of each row (order / k)
  at::Tensor slot_row;               ///< [N, k] the row holding each assignment; M where none does
};
ExpertGroups group_by_expert(const Routing& r, std::int64_t first, std::int64_t count);

/// The rows the experts see: token_of's rows of `tokens` [N, H] (a token
/// once per kept assignment), [M, H]. Its backward sums a token's row
/// gradients in slot order by gathering them (no zero-filled scatter-add):
/// the same bits as adding them one expert at a time from zero.
at::Tensor rows_by_expert(const at::Tensor& tokens, const ExpertGroups& g);

/// The un-permute and sum: `rows` [M, H] holds weighted expert outputs in
/// the groups' order; returns [N, H] where token t gets the sum of its rows
/// in slot order (= ascending expert order), slots without a row counting
/// as zero, as adding them one expert at a time would. One gather per slot
/// forward, one gather backward (no zero-filled scatter of the rows).
at::Tensor combine_by_token(const at::Tensor& rows, const ExpertGroups& g);
/// The expert outputs `rows` (in g.order) times their routing weights
/// (`r.weights`), summed per token (combine_by_token). Rows narrower than
/// fp32 (mixed precision) are weighted and summed in fp32 and the sum is
/// returned in their type, so the router's gradient (a dot product over
/// the hidden width per token) and the k-way sum are fp32.
at::Tensor combine_weighted(const at::Tensor& rows, const Routing& r, const ExpertGroups& g);

/// x.index_select(0, perm) for a permutation `perm` whose inverse is
/// `inverse`; its backward is the gradient's index_select by `inverse`
/// (no zero-filled scatter-add).
at::Tensor permute_rows(const at::Tensor& x, const at::Tensor& perm, const at::Tensor& inverse);

/// Per-layer counts of one step (for metrics and the aux-free bias).
struct MoeStats {
  std::vector<double> tokens_per_expert;  ///< kept assignments
  double selected = 0, dropped = 0;
};

/// The `moe` kind's common part: the router (replicated), the aux-free
/// bias (a model buffer, saved in checkpoints), shared experts (an `mlp`
/// of shared_experts x the expert width), auxiliary losses, statistics and
/// the end-of-step bias update. A subclass holds the experts and says how
/// tokens reach them (dispatch). LayerSpec: in = hidden, out = expert
/// width, moe = the options.
class MoeLayer : public Layer {
 public:
  MoeLayer(const LayerSpec& spec, BuildContext& ctx);
  at::Tensor forward(const at::Tensor& x) override;
  const MoeOptions& options() const { return o_; }
  const MoeStats& stats() const { return stats_; }
  /// Creates the stacked expert parameters ([E, ...] each), laid out by
  /// `placements` (none: every expert here; a shard along dimension 0
  /// holds a range of the experts). `ffn_dim` non-empty: each expert's FFN
  /// is split over that mesh dimension too, w1, b1 and w3 by their output
  /// features and w2 by its input features (b2 whole).
  ExpertWeights make_experts(BuildContext& ctx, const dist::Placements& placements = {},
                             const std::string& ffn_dim = "");
  bool swiglu() const { return swiglu_; }

 protected:
  /// For each token, the sum over its kept assignments (ascending expert
  /// order) of weight x expert output; [N, H] from tokens [N, H].
  virtual at::Tensor dispatch(const at::Tensor& tokens, const Routing& r) = 0;

  std::string name_;
  std::int64_t hidden_ = 0, ffn_ = 0;
  double init_std_ = 0.02;
  bool swiglu_ = false;  ///< SwiGLU experts (gate, up, down; no biases)

 private:
  MoeOptions o_;
  std::shared_ptr<const SequenceLayout> layout_;  ///< null unless sequences are split over ranks
  at::Tensor router_, bias_;
  std::shared_ptr<Layer> shared_;
  MoeStats stats_;
};

/// Every expert on this rank: the kept assignments grouped by expert
/// (group_by_expert), each expert's rows through its FFN
/// (ExpertWeights::forward_grouped), outputs weighted, un-permuted and
/// summed per token in ascending expert order (combine_by_token).
at::Tensor dispatch_locally(const ExpertWeights& w, std::int64_t first_expert,
                            const at::Tensor& tokens, const Routing& r,
                            ExpertCompute how = ExpertCompute::kSlices);

std::shared_ptr<Layer> make_dense_moe(const LayerSpec& spec, BuildContext& ctx);

}  // namespace hp
