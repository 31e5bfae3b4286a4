#include "plugins/tensor_parallel/layers.h"

#include <ATen/ATen.h>

#include "backends/dist/autograd.h"
#include "backends/dist/group.h"
#include "framework/config/config.h"

namespace hp::tensor_parallel {

namespace {

dist::Group& tp_group(BuildContext& ctx) { return *ctx.group("tp"); }

/// The sequence dimension of [batch, seq, features] activations.
constexpr std::int64_t kSeqDim = 1;

/// Where the gradient of a replicated (unsplit) parameter is summed. Used on
/// a sequence slice, each rank's gradient is partial: it is summed over tp
/// too, with the data-parallel sync after backward (one bucketed
/// all-reduce per step, as Megatron's layer-norm gradient all-reduce).
std::string replicated_sync(bool sp) { return sp ? "tp+dp" : "dp"; }

class ColumnLinear : public Layer {
 public:
  ColumnLinear(const LayerSpec& s, BuildContext& ctx, bool sp)
      : g_(tp_group(ctx)), gather_(s.gather_output), sp_(sp) {
    if (!s.tied_weight.empty()) {
      weight_ = ctx.shared(s.tied_weight);  // the embedding's vocabulary slice
    } else {
      weight_ = ctx.param(*this, s.name + ".weight", "weight", {s.out, s.in}, Init::normal(s.init_std), 0, "tp");
    }
    if (s.bias) bias_ = ctx.param(*this, s.name + ".bias", "bias", {s.out}, Init::zeros(), 0, "tp");
  }
  at::Tensor forward(const at::Tensor& x) override {
    // Sequence parallel: the input is this rank's slice of the sequence;
    // gather it (reduce-scatter of the gradient in backward).
    auto in = sp_ ? dist::all_gather_from_group(x, g_, kSeqDim) : dist::copy_to_group(x, g_);
    auto y = at::linear(in, weight_, bias_);
    if (!gather_) return y;
    y = dist::gather_from_group(y, g_, -1);
    // A full-width output under sequence parallel goes back to a sequence slice.
    return sp_ ? dist::scatter_to_group(y, g_, kSeqDim) : y;
  }

 private:
  dist::Group& g_;
  bool gather_, sp_;
  at::Tensor weight_, bias_;
};

class RowLinear : public Layer {
 public:
  RowLinear(const LayerSpec& s, BuildContext& ctx, bool sp)
      : g_(tp_group(ctx)), input_parallel_(s.input_is_parallel), sp_(sp) {
    weight_ = ctx.param(*this, s.name + ".weight", "weight", {s.out, s.in}, Init::normal(s.init_std), 1, "tp");
    if (s.bias) {
      bias_ = ctx.param(*this, s.name + ".bias", "bias", {s.out}, Init::zeros(), -1, "tp", replicated_sync(sp));
    }
  }
  at::Tensor forward(const at::Tensor& x) override {
    at::Tensor in = x;
    if (!input_parallel_) {
      // A sequence slice with all features: gather the sequence, keep our
      // features. The gathered input's gradient is whole on every rank (the
      // feature scatter all-gathers it), so backward keeps our slice, no sum.
      in = dist::scatter_to_group(sp_ ? dist::gather_from_group(x, g_, kSeqDim) : x, g_, -1);
    }
    auto partial = at::linear(in, weight_);
    // Sequence parallel: sum the partial outputs and keep this rank's slice of
    // the sequence (all-gather of the gradient in backward).
    auto y = sp_ ? dist::reduce_scatter_to_group(partial, g_, kSeqDim) : dist::reduce_from_group(partial, g_);
    return bias_.defined() ? y + bias_ : y;
  }

 private:
  dist::Group& g_;
  bool input_parallel_, sp_;
  at::Tensor weight_, bias_;
};

class VocabEmbedding : public Layer {
 public:
  VocabEmbedding(const LayerSpec& s, BuildContext& ctx, bool sp) : g_(tp_group(ctx)), sp_(sp) {
    weight_ = ctx.param(*this, s.name + ".weight", "weight", {s.in, s.out}, Init::normal(s.init_std), 0, "tp");
    ctx.share(s.name + ".weight", weight_);
    auto [off, len] = split_range(s.in, g_.size(), g_.rank());
    begin_ = off;
    end_ = off + len;
  }
  at::Tensor forward(const at::Tensor& ids) override {
    auto outside = (ids < begin_).logical_or(ids >= end_);
    auto local = (ids - begin_).masked_fill(outside, 0);
    auto out = at::embedding(weight_, local).masked_fill(outside.unsqueeze(-1), 0.0);
    return sp_ ? dist::reduce_scatter_to_group(out, g_, kSeqDim) : dist::reduce_from_group(out, g_);
  }

 private:
  dist::Group& g_;
  bool sp_;
  at::Tensor weight_;
  std::int64_t begin_ = 0, end_ = 0;
};

/// Under sequence parallel only: LayerNorm on this rank's slice of the
/// sequence, its weight and bias gradients summed over tp after backward.
class SequenceLayerNorm : public Layer {
 public:
  SequenceLayerNorm(const LayerSpec& s, BuildContext& ctx) : dim_(s.in) {
    weight_ = ctx.param(*this, s.name + ".weight", "weight", {s.in}, Init::ones(), -1, "tp", replicated_sync(true));
    bias_ = ctx.param(*this, s.name + ".bias", "bias", {s.in}, Init::zeros(), -1, "tp", replicated_sync(true));
  }
  at::Tensor forward(const at::Tensor& x) override { return at::layer_norm(x, {dim_}, weight_, bias_, 1e-5); }

 private:
  std::int64_t dim_;
  at::Tensor weight_, bias_;
};

/// Under sequence parallel only: adds the rows of the position table that
/// belong to this rank's slice of the sequence.
class SequencePositions : public Layer {
 public:
  SequencePositions(const LayerSpec& s, BuildContext& ctx) : g_(tp_group(ctx)) {
    weight_ = ctx.param(*this, s.name + ".weight", "weight", {s.in, s.out}, Init::normal(s.init_std), -1, "tp",
                        replicated_sync(true));
  }
  at::Tensor forward(const at::Tensor& h) override {
    const auto len = h.size(kSeqDim);
    return h + weight_.narrow(0, g_.rank() * len, len);
  }

 private:
  dist::Group& g_;
  at::Tensor weight_;
};

/// Under sequence parallel only: dropout on this rank's slice of the
/// sequence with the mask the dense layer would draw for the WHOLE sequence
/// (every tp rank draws it from the same generator state and keeps its
/// slice), so masks are independent along the sequence, exactly those of
/// a run without sequence parallel, and the generators stay in step.
class SequenceDropout : public Layer {
 public:
  SequenceDropout(const LayerSpec& s, BuildContext& ctx) : g_(tp_group(ctx)), p_(s.dropout) {}
  at::Tensor forward(const at::Tensor& x) override {
    if (p_ <= 0 || !is_training()) return x;
    auto full = x.sizes().vec();
    const auto len = full[kSeqDim];
    full[kSeqDim] = len * g_.size();
    // As at::dropout: Bernoulli(1 - p) noise scaled by 1 / (1 - p).
    at::Tensor noise = at::empty(full, x.options()).bernoulli_(1 - p_).div_(1 - p_);
    // A copy of our slice, so backward does not keep the whole-sequence noise alive.
    return x * noise.narrow(kSeqDim, g_.rank() * len, len).contiguous();
  }

 private:
  dist::Group& g_;
  double p_;
};

/// loss = log(sum_v exp(z_v - m)) - (z_target - m), with m the global max,
/// the sum and the target logit each reduced over tp from the local slice.
class VocabParallelCrossEntropy : public LossLayer {
 public:
  VocabParallelCrossEntropy(std::int64_t vocab, BuildContext& ctx) : g_(tp_group(ctx)) {
    auto [off, len] = split_range(vocab, g_.size(), g_.rank());
    begin_ = off;
    end_ = off + len;
  }
  LossOutput forward(const at::Tensor& logits, const at::Tensor& targets) override {
    auto z = logits.reshape({-1, logits.size(-1)});
    auto t = targets.reshape({-1});
    at::Tensor m = std::get<0>(z.detach().max(-1));  // the max only shifts: no gradient
    g_.all_reduce(m, dist::ReduceKind::kMax);
    auto shifted = z - m.unsqueeze(-1);
    auto sum_exp = dist::reduce_from_group(shifted.exp().sum(-1), g_);
    auto outside = (t < begin_).logical_or(t >= end_);
    auto local_t = (t - begin_).masked_fill(outside, 0);
    auto target = shifted.gather(-1, local_t.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0);
    target = dist::reduce_from_group(target, g_);
    return {(sum_exp.log() - target).sum(), t.numel()};
  }

 private:
  dist::Group& g_;
  std::int64_t begin_ = 0, end_ = 0;
};

template <typename T>
LayerFactory factory(bool sp) {
  return [sp](const LayerSpec& s, BuildContext& ctx) { return std::make_shared<T>(s, ctx, sp); };
}
template <typename T>
LayerFactory factory() {
  return [](const LayerSpec& s, BuildContext& ctx) { return std::make_shared<T>(s, ctx); };
}

}  // namespace

void replace_kinds(LayerRegistry& r, const std::string& owner, const Options& o) {
  r.replace("linear.column", owner, factory<ColumnLinear>(o.sequence_parallel));
  r.replace("linear.row", owner, factory<RowLinear>(o.sequence_parallel));
  r.replace("embedding.vocab", owner, factory<VocabEmbedding>(o.sequence_parallel));
  if (o.sequence_parallel) {
    r.replace("layer_norm", owner, factory<SequenceLayerNorm>());
    r.replace("embedding.position", owner, factory<SequencePositions>());
    r.replace("dropout", owner, factory<SequenceDropout>());
  }
  r.replace_loss("loss.cross_entropy", owner, [](const LayerSpec& s, BuildContext& ctx) {
    const std::int64_t vocab = s.out > 0 ? s.out : ctx.config().get_int("model.vocab_size");
    return std::make_shared<VocabParallelCrossEntropy>(vocab, ctx);
  });
}

}  // namespace hp::tensor_parallel
