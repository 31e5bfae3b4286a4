#include "plugins/tensor_parallel/layers.h"

#include <ATen/ATen.h>

#include "backends/dist/autograd.h"
#include "backends/dist/group.h"
#include "framework/config/config.h"

namespace hp::tensor_parallel {

namespace {

dist::Group& tp_group(BuildContext& ctx) {
  dist::Group* g = ctx.group("tp");
  if (!g) throw std::logic_error("tensor_parallel: layers built without process groups");
  return *g;
}

class ColumnLinear : public Layer {
 public:
  ColumnLinear(const LayerSpec& s, BuildContext& ctx) : g_(tp_group(ctx)), gather_(s.gather_output) {
    if (!s.tied_weight.empty()) {
      weight_ = ctx.shared(s.tied_weight);  // the embedding's vocabulary slice
    } else {
      weight_ = ctx.param(*this, s.name + ".weight", "weight", {s.out, s.in}, Init::normal(s.init_std), 0);
    }
    if (s.bias) bias_ = ctx.param(*this, s.name + ".bias", "bias", {s.out}, Init::zeros(), 0);
  }
  at::Tensor forward(const at::Tensor& x) override {
    auto y = at::linear(dist::copy_to_group(x, g_), weight_, bias_);
    return gather_ ? dist::gather_from_group(y, g_, -1) : y;
  }

 private:
  dist::Group& g_;
  bool gather_;
  at::Tensor weight_, bias_;
};

class RowLinear : public Layer {
 public:
  RowLinear(const LayerSpec& s, BuildContext& ctx) : g_(tp_group(ctx)), input_parallel_(s.input_is_parallel) {
    weight_ = ctx.param(*this, s.name + ".weight", "weight", {s.out, s.in}, Init::normal(s.init_std), 1);
    if (s.bias) bias_ = ctx.param(*this, s.name + ".bias", "bias", {s.out}, Init::zeros());
  }
  at::Tensor forward(const at::Tensor& x) override {
    auto in = input_parallel_ ? x : dist::scatter_to_group(x, g_, -1);
    auto y = dist::reduce_from_group(at::linear(in, weight_), g_);
    return bias_.defined() ? y + bias_ : y;
  }

 private:
  dist::Group& g_;
  bool input_parallel_;
  at::Tensor weight_, bias_;
};

class VocabEmbedding : public Layer {
 public:
  VocabEmbedding(const LayerSpec& s, BuildContext& ctx) : g_(tp_group(ctx)) {
    weight_ = ctx.param(*this, s.name + ".weight", "weight", {s.in, s.out}, Init::normal(s.init_std), 0);
    ctx.share(s.name + ".weight", weight_);
    auto [off, len] = split_range(s.in, g_.size(), g_.rank());
    begin_ = off;
    end_ = off + len;
  }
  at::Tensor forward(const at::Tensor& ids) override {
    auto outside = (ids < begin_).logical_or(ids >= end_);
    auto local = (ids - begin_).masked_fill(outside, 0);
    auto out = at::embedding(weight_, local).masked_fill(outside.unsqueeze(-1), 0.0);
    return dist::reduce_from_group(out, g_);
  }

 private:
  dist::Group& g_;
  at::Tensor weight_;
  std::int64_t begin_ = 0, end_ = 0;
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
LayerFactory factory() {
  return [](const LayerSpec& s, BuildContext& ctx) { return std::make_shared<T>(s, ctx); };
}

}  // namespace

void replace_kinds(LayerRegistry& r, const std::string& owner) {
  r.replace("linear.column", owner, factory<ColumnLinear>());
  r.replace("linear.row", owner, factory<RowLinear>());
  r.replace("embedding.vocab", owner, factory<VocabEmbedding>());
  r.replace_loss("loss.cross_entropy", owner, [](const LayerSpec& s, BuildContext& ctx) {
    const std::int64_t vocab = s.out > 0 ? s.out : ctx.config().get_int("model.vocab_size");
    return std::make_shared<VocabParallelCrossEntropy>(vocab, ctx);
  });
}

}  // namespace hp::tensor_parallel
