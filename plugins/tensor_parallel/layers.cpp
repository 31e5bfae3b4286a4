#include "plugins/tensor_parallel/layers.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <tuple>
#include <utility>

#include "hp/comm/autograd.h"
#include "hp/comm/context.h"
#include "hp/comm/group.h"
#include "hp/model/dropout.h"
#include "hp/model/kv_cache.h"
#include "hp/model/moe.h"
#include "hp/model/precision.h"
#include "hp/model/weight_grad.h"
#include "hp/config/config.h"

namespace hp::tensor_parallel {

namespace {


/// The sequence dimension of [batch, seq, features] activations.
constexpr std::int64_t kSeqDim = 1;

/// The tensor-parallel dimension this plugin registers.
const char* kTp = "tp";
/// Split along tensor dimension `d` over tp.
dist::Placements over_tp(int d) { return {{kTp, dist::Placement::shard(d)}}; }
/// A replicated parameter used on a sequence slice has a partial gradient on
/// each tp rank: summed over tp, then over the data dimensions, after
/// backward (one bucketed all-reduce per step, as Megatron's layer-norm
/// gradient all-reduce).
std::vector<std::string> partial_over_tp(bool sp) { return sp ? std::vector<std::string>{kTp} : std::vector<std::string>{}; }
dist::Group& tp_group(BuildContext& ctx) { return *ctx.group(kTp); }

/// The module kind whose layers are being built (set while attention.heads
/// and mlp build their column and row layers); null outside them.
thread_local const char* t_module = nullptr;
struct ModuleScope {
  const char* previous;
  explicit ModuleScope(const char* kind) : previous(t_module) { t_module = kind; }
  ~ModuleScope() { t_module = previous; }
};

/// The groups a module kind runs on, and the re-layout between the stream
/// (tp = T over `inner`, samples split over the data dimensions) and the
/// module (tp = T x M, the samples of the M `outer` neighbours gathered).
/// With no `outer` the module runs on the stream's tp, as without degrees.
struct ModuleGroups {
  dist::Group* inner = nullptr;
  dist::Group* outer = nullptr;
  dist::Group* flat = nullptr;
  std::string inner_dim = kTp, outer_dim;
  bool sp = false;

  /// Whether the stream is split along the sequence now: sequence parallel,
  /// except in generation (a decode step holds one position per sample; the
  /// key/value cache keeps whole sequences on every tp rank).
  bool seq() const { return sp && !current_kv_cache(); }
  /// Split along tensor dimension `d` over the module's ranks: outer first,
  /// so member (inner i, outer o) holds piece o x T + i.
  dist::Placements split(int d) const {
    if (!outer) return {{inner_dim, dist::Placement::shard(d)}};
    return {{outer_dim, dist::Placement::shard(d)}, {inner_dim, dist::Placement::shard(d)}};
  }
  /// Stream -> module input, whole on every module rank. Backward: the
  /// partial gradients summed over the module's ranks, each keeping its own.
  at::Tensor enter(const at::Tensor& x) const {
    at::Tensor y = seq() ? dist::all_gather_from_group(x, *inner, kSeqDim) : dist::copy_to_group(x, *inner);
    return outer ? dist::all_gather_from_group(y, *outer, 0) : y;
  }
  /// Module partial output -> stream: summed over the module's ranks, each
  /// keeping its own samples (and, under sequence parallel, its slice).
  at::Tensor leave(const at::Tensor& partial) const {
    at::Tensor y = outer ? dist::reduce_scatter_to_group(partial, *outer, 0) : partial;
    return seq() ? dist::reduce_scatter_to_group(y, *inner, kSeqDim) : dist::reduce_from_group(y, *inner);
  }
  /// The rows of the outer neighbours too (no gradient: token ids, targets).
  at::Tensor gather_rows(const at::Tensor& t) const { return outer ? outer->all_gather(t.contiguous(), 0) : t; }
  /// [offset, end) of this rank's piece of `total` along a split dimension
  /// (uneven allowed), as param() cuts it.
  std::pair<std::int64_t, std::int64_t> range(BuildContext& ctx, std::int64_t total) const {
    const dist::Placements p = split(0);
    const dist::Part part = dist::part_of({total, 1}, p, dist::coords_of(ctx.dist().mesh(), p, ctx.dist().rank()));
    const auto off = part.boxes.front().offsets[0];
    return {off, off + part.boxes.front().lengths[0]};
  }
};

/// The module input of the last column layer on this thread: column
/// layers that read the same tensor (q, k and v; SwiGLU's gate and up) share
/// one entry, so the sequence is gathered once forward and its gradient
/// summed (reduce-scattered, or all-reduced) once backward, as one fused
/// projection would. Keyed by the tensor (a weak reference: a tensor freed
/// since cannot match, and its address cannot be reused while the
/// reference exists), its version, the module's groups and the grad mode;
/// the entry is weak too (alive while the first layer's graph holds it).
/// A pipeline schedule's threads each keep their own.
using WeakTensor = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
struct EnterCache {
  WeakTensor x{c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>()};
  WeakTensor y{c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>()};
  std::uint32_t version = 0;
  const dist::Group* flat = nullptr;
  bool sp = false, grad = false;
};
thread_local EnterCache t_enter;

at::Tensor enter_once(const ModuleGroups& m, const at::Tensor& x) {
  EnterCache& c = t_enter;
  const bool grad = at::GradMode::is_enabled();
  if (c.flat == m.flat && c.sp == m.seq() && c.grad == grad && c.version == x._version()) {
    auto held = c.x.lock();
    if (held && held.get() == x.unsafeGetTensorImpl()) {
      auto y = c.y.lock();
      if (y) return at::Tensor(std::move(y));
    }
  }
  at::Tensor y = m.enter(x);
  c = EnterCache{WeakTensor(x.getIntrusivePtr()), WeakTensor(y.getIntrusivePtr()), x._version(), m.flat, m.seq(), grad};
  return y;
}

ModuleGroups groups_for(BuildContext& ctx, const Options& o, const std::string& kind) {
  ModuleGroups m;
  m.sp = o.sequence_parallel;
  auto it = o.modules.find(kind);
  if (it == o.modules.end()) {
    m.inner = m.flat = &tp_group(ctx);
    return m;
  }
  m.inner_dim = it->second.inner;
  m.outer_dim = it->second.outer;
  m.inner = ctx.group(m.inner_dim);
  m.outer = ctx.group(m.outer_dim);
  m.flat = ctx.group(it->second.flat);
  return m;
}

class ColumnLinear : public Layer {
 public:
  ColumnLinear(const LayerSpec& s, BuildContext& ctx, ModuleGroups m)
      : m_(std::move(m)), gather_(s.gather_output) {
    if (m_.outer && gather_) {
      throw std::invalid_argument("model error: linear.column '" + s.name +
                                  "' gathers its output, which a module above the stream's tensor-parallel "
                                  "degree does not do (its output stays split over features)");
    }
    const std::int64_t degree = m_.flat->size();
    if (s.split_unit > 0 && (s.out / s.split_unit) % degree != 0) {
      // Fewer units (key/value heads) than ranks: each rank holds the whole
      // weight and uses its unit; the ranks sharing a unit see different
      // query heads, so the gradient is partial over the module's ranks.
      const std::int64_t units = s.out / s.split_unit;
      if (degree % units != 0 || m_.outer || gather_) {
        throw std::invalid_argument("model error: linear.column '" + s.name + "': " + std::to_string(units) +
                                    " units of " + std::to_string(s.split_unit) +
                                    " features can be neither split nor shared over " + std::to_string(degree) +
                                    " ranks");
      }
      const std::vector<std::string> partial{m_.inner_dim};
      weight_ = ctx.param(*this, s.name + ".weight", "weight", {s.out, s.in}, Init::normal(s.init_std), {}, partial);
      if (s.bias) bias_ = ctx.param(*this, s.name + ".bias", "bias", {s.out}, Init::zeros(), {}, partial);
      const std::int64_t unit = m_.range(ctx, degree).first * units / degree;
      unit_ = {unit * s.split_unit, s.split_unit};
      return;
    }
    if (!s.tied_weight.empty()) {
      weight_ = ctx.shared(s.tied_weight);  // the embedding's vocabulary slice
    } else {
      weight_ = ctx.param(*this, s.name + ".weight", "weight", {s.out, s.in}, Init::normal(s.init_std), m_.split(0));
    }
    if (s.bias) bias_ = ctx.param(*this, s.name + ".bias", "bias", {s.out}, Init::zeros(), m_.split(0));
  }
  at::Tensor forward(const at::Tensor& x) override {
    if (unit_.second > 0) {
      // This rank's unit of the shared weight.
      const at::Tensor b = bias_.defined() ? bias_.narrow(0, unit_.first, unit_.second) : bias_;
      return precision::linear(enter_once(m_, x), weight_.narrow(0, unit_.first, unit_.second), b);
    }
    // Sequence parallel: the input is this rank's slice of the sequence;
    // gather it (reduce-scatter of the gradient in backward).
    auto y = precision::linear(enter_once(m_, x), weight_, bias_);
    if (!gather_) return y;
    y = dist::gather_from_group(y, *m_.inner, -1);
    // A full-width output under sequence parallel goes back to a sequence slice.
    return m_.seq() ? dist::scatter_to_group(y, *m_.inner, kSeqDim) : y;
  }

 private:
  ModuleGroups m_;
  bool gather_;
  at::Tensor weight_, bias_;
  std::pair<std::int64_t, std::int64_t> unit_{0, 0};  ///< shared weight: this rank's rows (offset, count)
};

class RowLinear : public Layer {
 public:
  RowLinear(const LayerSpec& s, BuildContext& ctx, ModuleGroups m)
      : m_(std::move(m)), input_parallel_(s.input_is_parallel) {
    if (m_.outer && !input_parallel_) {
      throw std::invalid_argument("model error: linear.row '" + s.name +
                                  "' takes a whole input, which a module above the stream's tensor-parallel "
                                  "degree does not do (its input comes split from a column layer)");
    }
    weight_ = ctx.param(*this, s.name + ".weight", "weight", {s.out, s.in}, Init::normal(s.init_std), m_.split(1));
    if (s.bias) {
      bias_ = ctx.param(*this, s.name + ".bias", "bias", {s.out}, Init::zeros(), {}, partial_over_tp(m_.sp));
    }
  }
  at::Tensor forward(const at::Tensor& x) override {
    at::Tensor in = x;
    if (!input_parallel_) {
      // A sequence slice with all features: gather the sequence, keep our
      // features. The gathered input's gradient is whole on every rank (the
      // feature scatter all-gathers it), so backward keeps our slice, no sum.
      in = dist::scatter_to_group(m_.seq() ? dist::gather_from_group(x, *m_.inner, kSeqDim) : x, *m_.inner, -1);
    }
    // Sum the partial outputs (under sequence parallel keeping this rank's
    // slice of the sequence; all-gather of the gradient in backward).
    auto y = m_.leave(precision::linear(in, weight_));
    // The bias added in fp32 (its gradient, a sum over tokens, in fp32).
    return bias_.defined() ? precision::in_fp32(y, [&](const at::Tensor& yf) { return yf + bias_; }) : y;
  }

 private:
  ModuleGroups m_;
  bool input_parallel_;
  at::Tensor weight_, bias_;
};

class VocabEmbedding : public Layer {
 public:
  VocabEmbedding(const LayerSpec& s, BuildContext& ctx, ModuleGroups m)
      : m_(std::move(m)), dtype_(ctx.precision().param_dtype) {
    weight_ = ctx.param(*this, s.name + ".weight", "weight", {s.in, s.out}, Init::normal(s.init_std), m_.split(0));
    ctx.mark_embedding(weight_);
    ctx.share(s.name + ".weight", weight_);
    std::tie(begin_, end_) = m_.range(ctx, s.in);
  }
  at::Tensor forward(const at::Tensor& tokens) override {
    const at::Tensor ids = m_.gather_rows(tokens);
    auto outside = (ids < begin_).logical_or(ids >= end_);
    auto local = (ids - begin_).masked_fill(outside, 0);
    // Cast before the sum: one rank holds each row, the others add zeros
    // (exact in any type), so the stream starts in the policy's type.
    return m_.leave(precision::cast(wgrad::embedding(weight_, local).masked_fill(outside.unsqueeze(-1), 0.0), dtype_));
  }

 private:
  ModuleGroups m_;
  at::ScalarType dtype_;
  at::Tensor weight_;
  std::int64_t begin_ = 0, end_ = 0;
};

/// A normalisation whose input tp ranks hold different parts of: LayerNorm
/// or RMSNorm on this rank's slice of the sequence (sequence parallel), or
/// RMSNorm on this rank's heads (norm.heads, the QK-norm, whenever the heads
/// are split); its gain (and bias) gradients summed over tp after backward.
class PartialNorm : public Layer {
 public:
  PartialNorm(const LayerSpec& s, BuildContext& ctx) : dim_(s.in), eps_(s.norm_eps), rms_(s.kind != "layer_norm") {
    weight_ = ctx.param(*this, s.name + ".weight", "weight", {s.in}, Init::ones(), {}, partial_over_tp(true));
    if (!rms_) bias_ = ctx.param(*this, s.name + ".bias", "bias", {s.in}, Init::zeros(), {}, partial_over_tp(true));
  }
  at::Tensor forward(const at::Tensor& x) override {
    return rms_ ? rms_norm(x, weight_, eps_) : precision::layer_norm(x, dim_, weight_, bias_, 1e-5);
  }

 private:
  std::int64_t dim_;
  double eps_;
  bool rms_;
  at::Tensor weight_, bias_;
};

/// Under a sequence layout (context parallel), the global positions of this
/// rank's slice of `len` positions: slice tp_rank of the positions the
/// layout gives this rank (tp members hold the same pieces).
std::vector<SeqPiece> my_pieces(const SequenceLayout& layout, const dist::Group& g, std::int64_t len) {
  return sub_pieces(layout.local_pieces(len * g.size()), g.rank() * len, len);
}

/// Under sequence parallel only: adds the rows of the position table that
/// belong to this rank's slice of the sequence.
class SequencePositions : public Layer {
 public:
  SequencePositions(const LayerSpec& s, BuildContext& ctx) : g_(tp_group(ctx)), layout_(ctx.sequence_layout()) {
    weight_ = ctx.param(*this, s.name + ".weight", "weight", {s.in, s.out}, Init::normal(s.init_std), {},
                        partial_over_tp(true));
    ctx.mark_embedding(weight_);
  }
  at::Tensor forward(const at::Tensor& h) override {
    const auto len = h.size(kSeqDim);
    const KvCache* cache = current_kv_cache();
    if (cache && (cache->decoding() || !layout_)) {  // generation: whole sequences, each sample at its positions
      const at::Tensor pos = cache->positions(current_dropout_site().first_sample, h.size(0));
      const at::Tensor w = weight_.index_select(0, pos.reshape({-1})).view({h.size(0), len, weight_.size(1)});
      return precision::in_fp32(h, [&](const at::Tensor& hf) { return hf + w; });
    }
    const at::Tensor w = layout_ ? take_pieces(weight_, 0, my_pieces(*layout_, g_, len)) : weight_.narrow(0, g_.rank() * len, len);
    // Added in fp32, the result in h's type (as the dense position table).
    return precision::in_fp32(h, [&](const at::Tensor& hf) { return hf + w; });
  }

 private:
  dist::Group& g_;
  std::shared_ptr<const SequenceLayout> layout_;
  at::Tensor weight_;
};

/// Under sequence parallel only: dropout on this rank's slice of the
/// sequence with the mask elements one process draws at those positions
/// (include/hp/model/dropout.h: a function of the global position).
class SequenceDropout : public Layer {
 public:
  SequenceDropout(const LayerSpec& s, BuildContext& ctx)
      : g_(tp_group(ctx)), layout_(ctx.sequence_layout()), p_(s.dropout), seed_(ctx.seed()),
        key_(stable_hash(s.name)) {}
  at::Tensor forward(const at::Tensor& x) override {
    if (p_ <= 0 || !is_training()) return x;
    if (layout_) return layout_free_dropout(x, p_, seed_, key_, my_pieces(*layout_, g_, x.size(kSeqDim)));
    return layout_free_dropout(x, p_, seed_, key_, g_.rank() * x.size(kSeqDim));
  }

 private:
  dist::Group& g_;
  std::shared_ptr<const SequenceLayout> layout_;
  double p_;
  std::uint64_t seed_, key_;
};

/// loss = log(sum_v exp(z_v - m)) - (z_target - m), with m the global max,
/// the sum and the target logit each reduced over tp from the local slice.
/// With the LM head above the stream's degree the logits are those of the
/// outer neighbours' samples too: the loss's value is this rank's samples',
/// its gradient that of every gathered sample (each logit slice lives on one
/// rank of the module, which must see every row's loss).
class VocabParallelCrossEntropy : public LossLayer {
 public:
  VocabParallelCrossEntropy(std::int64_t vocab, BuildContext& ctx, ModuleGroups m) : m_(std::move(m)), vocab_(vocab) {
    std::tie(begin_, end_) = m_.range(ctx, vocab);
  }
  // The whole vocabulary: each rank's slice in place, zeros elsewhere,
  // summed over the split (exact: one term per entry).
  at::Tensor gather_samples(const at::Tensor& t) override { return m_.gather_rows(t); }
  at::Tensor log_probs(const at::Tensor& rows) override {
    auto z = precision::cast(rows, at::kFloat).reshape({-1, rows.size(-1)});
    at::Tensor full = at::zeros({z.size(0), vocab_}, z.options());
    full.narrow(1, begin_, end_ - begin_).copy_(z);
    m_.flat->all_reduce(full);
    return at::log_softmax(full, -1);
  }
  LossOutput forward(const at::Tensor& logits, const at::Tensor& targets) override {
    dist::Group& g = *m_.flat;
    auto z = precision::cast(logits, at::kFloat).reshape({-1, logits.size(-1)});  // the loss in fp32
    auto t = m_.gather_rows(targets).reshape({-1});
    at::Tensor m = std::get<0>(z.detach().max(-1));  // the max only shifts: no gradient
    g.all_reduce(m, dist::ReduceKind::kMax);
    auto shifted = z - m.unsqueeze(-1);
    auto sum_exp = dist::reduce_from_group(shifted.exp().sum(-1), g);
    auto outside = (t < begin_).logical_or(t >= end_);
    auto local_t = (t - begin_).masked_fill(outside, 0);
    auto target = shifted.gather(-1, local_t.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0);
    target = dist::reduce_from_group(target, g);
    auto per_row = sum_exp.log() - target;
    if (!m_.outer) return {per_row.sum(), t.numel()};
    const std::int64_t n = targets.numel();
    at::Tensor all = per_row.sum();
    // all - all.detach() is exactly zero: the value stays this rank's.
    at::Tensor own = per_row.detach().narrow(0, m_.outer->rank() * n, n).sum();
    return {own + (all - all.detach()), n};
  }

 private:
  ModuleGroups m_;
  std::int64_t vocab_ = 0;
  std::int64_t begin_ = 0, end_ = 0;
};

/// A layer of the module being built, or of module kind `outside` when none is.
template <typename T>
LayerFactory module_factory(const Options& o, const char* outside) {
  return [o, outside](const LayerSpec& s, BuildContext& ctx) {
    return std::make_shared<T>(s, ctx, groups_for(ctx, o, t_module ? t_module : outside));
  };
}
template <typename T>
LayerFactory factory() {
  return [](const LayerSpec& s, BuildContext& ctx) { return std::make_shared<T>(s, ctx); };
}

}  // namespace

/// The "MoE tensor-parallel" mode: every expert on every tp rank, each
/// expert's FFN split column/row over tp (fc1 by its output features, fc2
/// by its input features), one all-reduce of the layer's output; fc2's bias
/// is added once, after the reduction. Offered, not imposed: with
/// expert_parallel the experts are split over ep instead. The experts run
/// as at one process (grouped by expert, the packed products where they
/// apply) on their FFN slices; a loop over the experts with index_add
/// measured 0.91 s a step against 0.44 s for dp=2 on the MoE GPT 4 x 256.
class TensorParallelMoe : public MoeLayer {
 public:
  TensorParallelMoe(const LayerSpec& s, BuildContext& ctx)
      : MoeLayer(s, ctx), g_(tp_group(ctx)), w_(make_experts(ctx, {}, kTp)) {
    if (w_.b2.defined()) {
      // The slices' outputs are partial sums and carry no bias: b2 (whole
      // on every rank) is added once, after the sum over tp.
      b2_ = w_.b2;
      w_.b2 = at::zeros(b2_.sizes(), b2_.options());
    }
  }

 protected:
  at::Tensor dispatch(const at::Tensor& tokens, const Routing& r) override {
    // Each rank's expert outputs are partial sums over its FFN slice, so the
    // gradients they send back (to the tokens and to the routing weights)
    // are partial too: both enter through copy_to_group (all-reduce in
    // backward). The bias term uses the weights directly: it is whole.
    const ExpertGroups g = group_by_expert(r, 0, options().num_experts);
    Routing split = r;
    split.weights = dist::copy_to_group(r.weights, g_);
    at::Tensor rows = w_.forward_grouped(rows_by_expert(dist::copy_to_group(tokens, g_), g), g.counts,
                                         options().compute);
    // Weighted and summed per token (in fp32 under mixed precision),
    // crossing in the tokens' type.
    at::Tensor out = dist::reduce_from_group(combine_weighted(rows, split, g), g_);
    if (!b2_.defined()) return out;
    const at::Tensor counts = at::tensor(g.counts, at::kLong);
    const at::Tensor expert_of = at::repeat_interleave(at::arange(options().num_experts, at::kLong), counts);
    const at::Tensor bias = combine_weighted(b2_.index_select(0, expert_of), r, g);
    return precision::cast(precision::cast(out, at::kFloat) + precision::cast(bias, at::kFloat),
                           tokens.scalar_type());
  }

 private:
  dist::Group& g_;
  ExpertWeights w_;  ///< every expert, each FFN split over tp (b2 zeros: see b2_)
  at::Tensor b2_;    ///< the whole fc2 bias, added after the sum over tp
};

void replace_kinds(LayerRegistry& r, const std::string& owner, const Options& o) {
  // A column outside attention and FFN is the LM head (its split logits
  // feed the loss); a row outside them runs on the stream's tp.
  r.replace("linear.column", owner, module_factory<ColumnLinear>(o, "lm_head"));
  r.replace("linear.row", owner, module_factory<RowLinear>(o, "stream"));
  r.replace("embedding.vocab", owner, module_factory<VocabEmbedding>(o, "embedding"));
  if (!o.modules.empty()) {
    // Attention and FFN are built as without degrees (from the column and
    // row kinds), inside a scope that tells those layers their module.
    auto dense = std::make_shared<const LayerRegistry>(LayerRegistry::dense());
    for (const auto& [kind, module] : {std::pair<const char*, const char*>{"attention.heads", "attention"},
                                       std::pair<const char*, const char*>{"mlp", "ffn"}}) {
      r.replace(kind, owner, [dense, module = module](const LayerSpec& s, BuildContext& ctx) {
        ModuleScope scope(module);
        return dense->make(s, ctx);
      });
    }
  }
  r.replace("norm.heads", owner, factory<PartialNorm>());
  if (o.sequence_parallel) {
    r.replace("layer_norm", owner, factory<PartialNorm>());
    r.replace("rms_norm", owner, factory<PartialNorm>());
    r.replace("embedding.position", owner, factory<SequencePositions>());
    r.replace("dropout", owner, factory<SequenceDropout>());
  }
  r.offer("moe", owner, [](const LayerSpec& s, BuildContext& ctx) { return std::make_shared<TensorParallelMoe>(s, ctx); });
  r.replace_loss("loss.cross_entropy", owner, [o](const LayerSpec& s, BuildContext& ctx) {
    if (s.out <= 0) {
      throw std::invalid_argument("model error: loss.cross_entropy '" + s.name +
                                  "' under tensor parallel needs the vocabulary size as LayerSpec::out (the logits "
                                  "are split over it)");
    }
    return std::make_shared<VocabParallelCrossEntropy>(s.out, ctx, groups_for(ctx, o, "lm_head"));
  });
}

}  // namespace hp::tensor_parallel
