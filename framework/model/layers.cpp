#include "hp/model/layers.h"

#include "hp/model/block_attention.h"
#include "hp/model/dropout.h"
#include "hp/model/kv_cache.h"
#include "hp/model/moe.h"
#include "hp/model/precision.h"
#include "hp/model/weight_grad.h"
#include "framework/model/tensor_dump.h"

#include <ATen/ATen.h>

#include <cmath>
#include <stdexcept>

namespace hp {

namespace {
// The micro-batch's documents must cover the samples and positions the
// attention holds.
void check_documents(const at::Tensor& documents, const at::Tensor& q) {
  if (documents.dim() != 2 || documents.size(0) != q.size(0) || documents.size(1) != q.size(1)) {
    throw std::invalid_argument(
        "attention: the micro-batch's documents are [" + std::to_string(documents.size(0)) + ", " +
        std::to_string(documents.dim() > 1 ? documents.size(1) : 0) + "] but the attention holds [" +
        std::to_string(q.size(0)) + ", " + std::to_string(q.size(1)) +
        "] (samples, positions): data.document_attention does not support an attention module that gathers "
        "other ranks' samples (a per-module degree above the residual stream's)");
  }
}
}  // namespace

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& documents) {
  // [B, T, h, d] -> [B, h, T, d]
  auto qt = q.transpose(1, 2), kt = k.transpose(1, 2), vt = v.transpose(1, 2);
  const auto T = q.size(1);
  // Products in q's type; the scores' scaling, mask and softmax in fp32
  // (no-op casts for fp32), the probabilities back in q's type for P v.
  auto scores = precision::cast(precision::matmul(qt, kt.transpose(-2, -1)), at::kFloat) /
                std::sqrt(static_cast<double>(q.size(3)));
  auto mask = at::ones({T, T}, q.options().dtype(at::kBool)).triu(1);
  if (documents.defined()) {  // [B, 1, T, T]: also another document's keys
    check_documents(documents, q);
    mask = mask.logical_or(documents.unsqueeze(2).ne(documents.unsqueeze(1))).unsqueeze(1);
  }
  scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
  auto ctx = precision::matmul(precision::softmax_as(scores, q.scalar_type()), vt);  // [B, h, T, d]
  return ctx.transpose(1, 2).reshape({q.size(0), T, q.size(2) * q.size(3)});
}

at::Tensor LossLayer::log_probs(const at::Tensor& logits) {
  return at::log_softmax(precision::cast(logits, at::kFloat), -1);
}

at::Tensor repeat_kv(const at::Tensor& kv, std::int64_t heads) {
  const std::int64_t h = kv.size(2);
  if (h == heads) return kv;
  if (h <= 0 || heads % h != 0) {
    throw std::invalid_argument("repeat_kv: " + std::to_string(h) + " key/value heads do not divide " +
                                std::to_string(heads) + " query heads");
  }
  // [B, T, h, d] -> [B, T, h, g, d] -> [B, T, h g, d]: head j reads j / g.
  return kv.unsqueeze(3).expand({kv.size(0), kv.size(1), h, heads / h, kv.size(3)}).reshape(
      {kv.size(0), kv.size(1), heads, kv.size(3)});
}

at::Tensor rotary(const at::Tensor& x, const at::Tensor& positions, double theta) {
  const std::int64_t d = x.size(-1), half = d / 2;
  if (d % 2 != 0) throw std::invalid_argument("rotary: the head width " + std::to_string(d) + " is odd");
  // inv_freq_i = 1 / theta^(2i / d); angle = position x inv_freq, the
  // second half of the features repeating the first half's angles.
  const at::Tensor inv_freq = at::reciprocal(at::pow(theta, at::arange(0, d, 2, at::kFloat) / static_cast<double>(d)));
  // positions [T] (every sample alike) or [samples, T] (generation)
  const at::Tensor freqs = positions.to(at::kFloat).unsqueeze(-1) * inv_freq;  // [..., T, half]
  const at::Tensor emb = positions.dim() == 1 ? at::cat({freqs, freqs}, -1).view({1, positions.size(0), 1, d})
                                             : at::cat({freqs, freqs}, -1).unsqueeze(2);
  const at::Tensor cos = emb.cos(), sin = emb.sin();
  return precision::in_fp32(x, [&](const at::Tensor& xf) {
    const at::Tensor rot = at::cat({xf.narrow(-1, half, half).neg(), xf.narrow(-1, 0, half)}, -1);
    return xf * cos + rot * sin;
  });
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  return precision::in_fp32(x, [&](const at::Tensor& xf) {
    return wgrad::scale(xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps), w);
  });
}

namespace {

class DenseLinear : public Layer {
 public:
  DenseLinear(const LayerSpec& s, BuildContext& ctx) {
    if (!s.tied_weight.empty()) {
      weight_ = ctx.shared(s.tied_weight);
    } else {
      weight_ = ctx.param(*this, s.name + ".weight", "weight", {s.out, s.in}, Init::normal(s.init_std));
    }
    if (s.bias) bias_ = ctx.param(*this, s.name + ".bias", "bias", {s.out}, Init::zeros());
  }
  at::Tensor forward(const at::Tensor& x) override { return precision::linear(x, weight_, bias_); }

 private:
  at::Tensor weight_, bias_;
};

class DenseEmbedding : public Layer {
 public:
  DenseEmbedding(const LayerSpec& s, BuildContext& ctx) : dtype_(ctx.precision().param_dtype) {
    weight_ = ctx.param(*this, s.name + ".weight", "weight", {s.in, s.out}, Init::normal(s.init_std));
    ctx.mark_embedding(weight_);
    ctx.share(s.name + ".weight", weight_);
  }
  /// The rows looked up in fp32, then cast: the activation stream starts
  /// in the policy's type.
  at::Tensor forward(const at::Tensor& ids) override {
    return precision::cast(wgrad::embedding(weight_, ids), dtype_);
  }

 private:
  at::Tensor weight_;
  at::ScalarType dtype_;
};

/// Dropout with probability spec.dropout while training, its mask a
/// function of the site and the layer's global name (include/hp/model/dropout.h).
class DenseDropout : public Layer {
 public:
  DenseDropout(const LayerSpec& s, BuildContext& ctx)
      : p_(s.dropout), seed_(ctx.seed()), key_(stable_hash(s.name)), layout_(ctx.sequence_layout()) {}
  at::Tensor forward(const at::Tensor& x) override {
    if (p_ <= 0 || !is_training()) return x;
    // Under a sequence layout the mask follows the global positions held.
    if (layout_ && x.dim() == 3) return layout_free_dropout(x, p_, seed_, key_, layout_->local_pieces(x.size(1)));
    return layout_free_dropout(x, p_, seed_, key_);
  }

 private:
  double p_;
  std::uint64_t seed_, key_;
  std::shared_ptr<const SequenceLayout> layout_;
};

/// Adds learned positions: h[:, t] += weight[t], t the global position
/// (under a sequence layout, those of the pieces this rank holds).
class DensePositions : public Layer {
 public:
  DensePositions(const LayerSpec& s, BuildContext& ctx) : layout_(ctx.sequence_layout()) {
    weight_ = ctx.param(*this, s.name + ".weight", "weight", {s.in, s.out}, Init::normal(s.init_std));
    ctx.mark_embedding(weight_);
  }
  at::Tensor forward(const at::Tensor& h) override {
    // Added in fp32 (one rounding, and the table's gradient, a sum over
    // the batch, in fp32), the result in h's type; no-op casts for fp32.
    at::Tensor w;
    const KvCache* cache = current_kv_cache();
    if (cache && (cache->decoding() || !layout_)) {  // generation: each sample at its own positions
      const at::Tensor pos = cache->positions(current_dropout_site().first_sample, h.size(0));
      w = weight_.index_select(0, pos.reshape({-1})).view({h.size(0), h.size(1), weight_.size(1)});
    } else {
      w = layout_ ? take_pieces(weight_, 0, layout_->local_pieces(h.size(1))) : weight_.narrow(0, 0, h.size(1));
    }
    return precision::in_fp32(h, [&](const at::Tensor& hf) { return hf + w; });
  }

 private:
  at::Tensor weight_;
  std::shared_ptr<const SequenceLayout> layout_;
};

class DenseLayerNorm : public Layer {
 public:
  DenseLayerNorm(const LayerSpec& s, BuildContext& ctx) : dim_(s.in) {
    weight_ = ctx.param(*this, s.name + ".weight", "weight", {s.in}, Init::ones());
    bias_ = ctx.param(*this, s.name + ".bias", "bias", {s.in}, Init::zeros());
  }
  at::Tensor forward(const at::Tensor& x) override {
    // Statistics in fp32, the result in x's type.
    return precision::layer_norm(x, dim_, weight_, bias_, 1e-5);
  }

 private:
  std::int64_t dim_;
  at::Tensor weight_, bias_;
};

/// RMSNorm (rms_norm, and norm.heads where no feature splits the heads).
class DenseRmsNorm : public Layer {
 public:
  DenseRmsNorm(const LayerSpec& s, BuildContext& ctx) : eps_(s.norm_eps) {
    weight_ = ctx.param(*this, s.name + ".weight", "weight", {s.in}, Init::ones());
  }
  at::Tensor forward(const at::Tensor& x) override { return rms_norm(x, weight_, eps_); }

 private:
  double eps_;
  at::Tensor weight_;
};

/// q, k, v from one column-split projection whose rows are laid out head by
/// head ([head][q|k|v][head_dim]), so any split by whole heads keeps q, k and
/// v of a head together; output projection row-split.
class HeadsAttention : public Layer {
 public:
  HeadsAttention(const LayerSpec& s, BuildContext& ctx)
      : head_dim_(s.in / s.heads), block_(s.attention == "block" ? s.attention_block : 0),
        rope_theta_(s.rope_theta) {
    if (s.attention != "eager" && s.attention != "block") {
      throw std::invalid_argument("model error: '" + s.name + "': attention '" + s.attention +
                                  "' is unknown (legal: eager, block)");
    }
    if (s.kv_heads == 0) {
      LayerSpec qkv{"linear.column", s.name + ".qkv", s.in, 3 * s.in};
      qkv.with_bias(s.bias).with_gather_output(false).with_init_std(s.init_std);
      qkv_ = register_module("qkv", ctx.layers().make(qkv, ctx));
    } else {
      // Separate projections (the Hugging Face layout): q by query heads,
      // k and v by whole key/value heads.
      if (s.heads % s.kv_heads != 0) {
        throw std::invalid_argument("model error: '" + s.name + "': " + std::to_string(s.kv_heads) +
                                    " key/value heads do not divide " + std::to_string(s.heads) + " query heads");
      }
      const std::int64_t kv_width = s.kv_heads * head_dim_;
      LayerSpec q{"linear.column", s.name + ".q", s.in, s.in};
      q.with_bias(s.bias || s.qkv_bias).with_gather_output(false).with_init_std(s.init_std).with_split_unit(head_dim_);
      q_ = register_module("q", ctx.layers().make(q, ctx));
      for (const char* which : {"k", "v"}) {
        LayerSpec kv{"linear.column", s.name + "." + which, s.in, kv_width};
        kv.with_bias(s.bias || s.qkv_bias).with_gather_output(false).with_init_std(s.init_std).with_split_unit(head_dim_);
        (which[0] == 'k' ? k_ : v_) = register_module(which, ctx.layers().make(kv, ctx));
      }
      if (s.qk_norm) {
        for (const char* which : {"q_norm", "k_norm"}) {
          LayerSpec n{"norm.heads", s.name + "." + which, head_dim_};
          n.with_norm_eps(s.norm_eps);
          (which[0] == 'q' ? q_norm_ : k_norm_) = register_module(which, ctx.layers().make(n, ctx));
        }
      }
    }
    LayerSpec proj{"linear.row", s.name + ".proj", s.in, s.in};
    proj.with_bias(s.bias).with_input_is_parallel(true).with_init_std(s.init_std);
    proj_ = register_module("proj", ctx.layers().make(proj, ctx));
    layout_ = ctx.sequence_layout();
    if (const Wrapper* w = ctx.wrapper("attention.core")) core_wrapper_ = *w;
    if (ctx.sequence_layout()) layout_attention_ = ctx.sequence_layout()->attention;
  }
  at::Tensor forward(const at::Tensor& x) override {
    std::vector<at::Tensor> parts;
    if (qkv_) {
      auto y = qkv_->forward(x);  // [B, T, local_heads * 3 * head_dim]
      const auto local_heads = y.size(-1) / (3 * head_dim_);
      // y.size(1), not x.size(1): under sequence parallel x is a slice of the
      // sequence and the projection gathered all of it.
      parts = y.view({y.size(0), y.size(1), local_heads, 3, head_dim_}).unbind(3);
    } else {
      auto heads_of = [this](const at::Tensor& y) { return y.view({y.size(0), y.size(1), -1, head_dim_}); };
      parts = {heads_of(q_->forward(x)), heads_of(k_->forward(x)), heads_of(v_->forward(x))};
    }
    if (q_norm_) {
      parts[0] = q_norm_->forward(parts[0]);
      parts[1] = k_norm_->forward(parts[1]);
    }
    KvCache* cache = current_kv_cache();
    const std::int64_t first_sample = current_dropout_site().first_sample;
    if (rope_theta_ > 0) {
      // By global position: under a sequence layout, those of the pieces
      // this rank holds; in generation, each sample's own.
      const std::int64_t T = parts[0].size(1);
      // (A prefill under a sequence layout holds the layout's pieces.)
      const at::Tensor pos = cache && (cache->decoding() || !layout_) ? cache->positions(first_sample, parts[0].size(0))
                             : layout_ ? piece_positions(layout_->local_pieces(T))
                                       : at::arange(T, at::kLong);
      parts[0] = rotary(parts[0], pos, rope_theta_);
      parts[1] = rotary(parts[1], pos, rope_theta_);
    }
    if (cache) {
      // Generation: keep this forward's keys and values; a decode step
      // attends over every position cached so far.
      // A prefill under a sequence layout (context parallel) keeps the
      // whole sequence's keys and values on every rank of the layout: the
      // decode steps after it run without the layout, the same on each.
      const bool whole = cache->decoding() || !layout_;
      const KvCache::View kv = cache->store(this, first_sample, whole ? parts[1] : layout_->gather(parts[1]),
                                            whole ? parts[2] : layout_->gather(parts[2]));
      if (cache->decoding()) return proj_->forward(cached_attention(parts[0], kv));
    }
    // Grouped-query attention: every query head meets its key/value head.
    parts[1] = repeat_kv(parts[1], parts[0].size(2));
    parts[2] = repeat_kv(parts[2], parts[0].size(2));
    // Eager or block attention; either may run inside the "attention.core"
    // wrapper (selective recompute), which replays it in backward.
    // Under a sequence layout, the layout's attention (other ranks hold the
    // rest of the keys and values).
    // With data.document_attention, the micro-batch's documents, taken
    // now and held by the closure: a replay in backward (selective
    // recompute) sees the same ones.
    auto attend = [block = block_, &layout = layout_attention_, docs = current_dropout_site().documents](
                      const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
      if (layout) return layout(q, k, v, docs);
      if (docs.defined()) check_documents(docs, q);
      return block > 0 ? block_causal_attention(q, k, v, block, docs) : causal_attention(q, k, v, docs);
    };
    at::Tensor ctx;
    if (core_wrapper_) {
      ForwardFn core = [attend](const Activations& a) {
        return make_activations({{"y", attend(a["q"], a["k"], a["v"])}});
      };
      ctx = core_wrapper_(core, make_activations({{"q", parts[0]}, {"k", parts[1]}, {"v", parts[2]}}))["y"];
    } else {
      ctx = attend(parts[0], parts[1], parts[2]);
    }
    return proj_->forward(ctx);
  }

 private:
  std::int64_t head_dim_;
  std::int64_t block_;  ///< block length of block attention; 0: eager
  double rope_theta_;   ///< 0: no rotary embedding
  std::shared_ptr<Layer> qkv_, q_, k_, v_, q_norm_, k_norm_, proj_;
  std::shared_ptr<const SequenceLayout> layout_;
  Wrapper core_wrapper_;
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&)> layout_attention_;
};

class ColumnRowMlp : public Layer {
 public:
  ColumnRowMlp(const LayerSpec& s, BuildContext& ctx) {
    if (s.activation == "swiglu") {
      // down(silu(gate x) * up x): gate and up split alike by columns.
      for (const char* which : {"gate", "up"}) {
        LayerSpec c{"linear.column", s.name + "." + which, s.in, s.out};
        c.with_bias(s.bias).with_gather_output(false).with_init_std(s.init_std);
        (which[0] == 'g' ? gate_ : fc1_) = register_module(which, ctx.layers().make(c, ctx));
      }
      LayerSpec down{"linear.row", s.name + ".down", s.out, s.in};
      down.with_bias(s.bias).with_input_is_parallel(true).with_init_std(s.init_std);
      fc2_ = register_module("down", ctx.layers().make(down, ctx));
      return;
    }
    if (s.activation != "gelu") {
      throw std::invalid_argument("model error: '" + s.name + "': activation '" + s.activation +
                                  "' is unknown (legal: gelu, swiglu)");
    }
    LayerSpec fc1{"linear.column", s.name + ".fc1", s.in, s.out};
    fc1.with_bias(s.bias).with_gather_output(false).with_init_std(s.init_std);
    LayerSpec fc2{"linear.row", s.name + ".fc2", s.out, s.in};
    fc2.with_bias(s.bias).with_input_is_parallel(true).with_init_std(s.init_std);
    fc1_ = register_module("fc1", ctx.layers().make(fc1, ctx));
    fc2_ = register_module("fc2", ctx.layers().make(fc2, ctx));
  }
  at::Tensor forward(const at::Tensor& x) override {
    if (gate_) return fc2_->forward(at::silu(gate_->forward(x)) * fc1_->forward(x));
    return fc2_->forward(at::gelu(fc1_->forward(x)));
  }

 private:
  std::shared_ptr<Layer> gate_, fc1_, fc2_;  ///< swiglu: gate, up (fc1_), down (fc2_)
};

class DenseCrossEntropy : public LossLayer {
 public:
  LossOutput forward(const at::Tensor& logits, const at::Tensor& targets) override {
    auto flat = precision::cast(logits, at::kFloat).reshape({-1, logits.size(-1)});  // the loss in fp32
    auto sum = at::nll_loss(at::log_softmax(flat, -1), targets.reshape({-1}), {},
                            at::Reduction::Sum);
    return {sum, targets.numel()};
  }
};

template <typename T>
LayerFactory factory() {
  return [](const LayerSpec& s, BuildContext& ctx) { return std::make_shared<T>(s, ctx); };
}

}  // namespace

LayerRegistry LayerRegistry::dense() {
  LayerRegistry r;
  r.layers_["linear.column"] = {"dense", factory<DenseLinear>()};
  r.layers_["linear.row"] = {"dense", factory<DenseLinear>()};
  r.layers_["embedding.vocab"] = {"dense", factory<DenseEmbedding>()};
  r.layers_["embedding.position"] = {"dense", factory<DensePositions>()};
  r.layers_["dropout"] = {"dense", factory<DenseDropout>()};
  r.layers_["layer_norm"] = {"dense", factory<DenseLayerNorm>()};
  r.layers_["rms_norm"] = {"dense", factory<DenseRmsNorm>()};
  r.layers_["norm.heads"] = {"dense", factory<DenseRmsNorm>()};
  r.layers_["attention.heads"] = {"dense", factory<HeadsAttention>()};
  r.layers_["mlp"] = {"dense", factory<ColumnRowMlp>()};
  r.layers_["moe"] = {"dense", make_dense_moe};
  r.losses_["loss.cross_entropy"] = {"dense", [](const LayerSpec&, BuildContext&) {
                                       return std::make_shared<DenseCrossEntropy>();
                                     }};
  return r;
}

namespace {
/// A kind may be replaced once, and only if it exists.
template <typename Map, typename Factory>
void replace_in(Map& map, const char* what, const std::string& kind, const std::string& owner,
                Factory f) {
  auto it = map.find(kind);
  if (it == map.end()) {
    throw std::invalid_argument("feature '" + owner + "' replaces unknown " + what + " kind '" +
                                kind + "'");
  }
  if (it->second.owner != "dense") {
    throw std::invalid_argument(std::string(what) + " kind '" + kind + "' is replaced by both '" +
                                it->second.owner + "' and '" + owner + "'");
  }
  it->second.owner = owner;
  it->second.factory = std::move(f);
}
}  // namespace

void LayerRegistry::replace(const std::string& kind, const std::string& owner, LayerFactory f) {
  auto it = layers_.find(kind);
  if (it != layers_.end() && it->second.offered) {
    it->second = {owner, std::move(f), false};
    return;
  }
  replace_in(layers_, "layer", kind, owner, std::move(f));
}

void LayerRegistry::offer(const std::string& kind, const std::string& owner, LayerFactory f) {
  auto it = layers_.find(kind);
  if (it != layers_.end() && it->second.owner != "dense" && !it->second.offered) return;  // replaced outright
  replace_in(layers_, "layer", kind, owner, std::move(f));
  layers_.at(kind).offered = true;
}

void LayerRegistry::replace_loss(const std::string& kind, const std::string& owner, LossFactory f) {
  replace_in(losses_, "loss", kind, owner, std::move(f));
}

namespace {

/// A layer whose forward output a tensor dump records
/// (`training.dump_activations_steps`); built only when such a dump is asked.
class DumpedLayer : public Layer {
 public:
  DumpedLayer(std::string name, std::shared_ptr<Layer> inner) : name_(std::move(name)), inner_(std::move(inner)) {
    register_module("inner", inner_);
  }
  at::Tensor forward(const at::Tensor& x) override {
    at::Tensor y = inner_->forward(x);
    if (tensor_dump::recording(tensor_dump::kActivations)) tensor_dump::record(name_, "out", y);
    return y;
  }

 private:
  std::string name_;
  std::shared_ptr<Layer> inner_;
};

}  // namespace

std::shared_ptr<Layer> LayerRegistry::make(const LayerSpec& spec, BuildContext& ctx) const {
  auto it = layers_.find(spec.kind);
  if (it == layers_.end()) {
    throw std::invalid_argument("model error: unknown layer kind '" + spec.kind + "' for '" +
                                spec.name + "'");
  }
  auto layer = it->second.factory(spec, ctx);
  if (tensor_dump::configured() & tensor_dump::kActivations) return std::make_shared<DumpedLayer>(spec.name, layer);
  return layer;
}

std::shared_ptr<LossLayer> LayerRegistry::make_loss(const LayerSpec& spec, BuildContext& ctx) const {
  auto it = losses_.find(spec.kind);
  if (it == losses_.end()) {
    throw std::invalid_argument("model error: unknown loss kind '" + spec.kind + "'");
  }
  return it->second.factory(spec, ctx);
}

std::string LayerRegistry::owner(const std::string& kind) const {
  auto it = layers_.find(kind);
  if (it != layers_.end()) return it->second.owner;
  auto jt = losses_.find(kind);
  return jt == losses_.end() ? "" : jt->second.owner;
}

}  // namespace hp
