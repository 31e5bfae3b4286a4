#pragma once
// Layers are asked for by KIND, never by class. With no feature loaded every
// kind builds the dense LibTorch layer; a feature (tensor parallel, expert
// parallel) replaces a kind, and models written once run on any layout.
//
// Kinds: linear.column, linear.row, embedding.vocab, embedding.position
// (adds learned positions to [batch, seq, hidden]; in = max positions),
// attention.heads, mlp, moe (mixture of experts, include/hp/model/moe.h),
// layer_norm, rms_norm (in = width, eps = LayerSpec::norm_eps), norm.heads
// (RMSNorm over the last dimension of a tensor split by heads: the QK-norm;
// a feature that splits the heads sums its gain's gradient over them),
// dropout (probability LayerSpec::dropout), loss.cross_entropy (out = the
// vocabulary size: a feature that splits the logits needs it).
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "hp/model/block.h"
#include "hp/model/build_context.h"

namespace hp {

/// A layer with one input and one output tensor.
class Layer : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& x) = 0;
};

/// Cross entropy over logits (possibly split over the vocabulary by a
/// feature) and integer targets; returns the summed loss and token count.
class LossLayer : public torch::nn::Module {
 public:
  virtual LossOutput forward(const at::Tensor& logits, const at::Tensor& targets) = 0;
  /// Log-probabilities over the whole vocabulary of some rows of logits
  /// ([rows, this rank's vocabulary slice] -> [rows, vocabulary], fp32), on
  /// every rank that holds a slice of those rows (generation). The default:
  /// log_softmax of whole logits. A vocabulary split over ranks overrides it
  /// (every rank of the split calls it at once, with the same rows).
  virtual at::Tensor log_probs(const at::Tensor& logits);
  /// See LossBlock::gather_samples.
  virtual at::Tensor gather_samples(const at::Tensor& t) { return t; }
};

struct MoeOptions;  // include/hp/model/moe.h

struct LayerSpec {
  std::string kind;
  std::string name;          ///< global prefix of its parameters, e.g. "blocks.3.attn"
  std::int64_t in = 0;       ///< input features; vocabulary size for embedding.vocab;
                             ///< positions for embedding.position
  std::int64_t out = 0;      ///< output features; embedding width; FFN width for mlp
  std::int64_t heads = 0;    ///< attention.heads: query heads
  /// attention.heads: key/value heads (grouped-query attention; a divisor
  /// of heads, 1 = multi-query). 0: the fused GPT layout (one qkv
  /// projection laid out head by head, heads = key/value heads); > 0:
  /// separate q, k, v projections, k and v split by whole key/value heads.
  std::int64_t kv_heads = 0;
  /// attention.heads: rotary position embeddings on q and k with this base
  /// (rotate-half convention); 0: none.
  double rope_theta = 0.0;
  /// attention.heads: RMSNorm of q and k per head before the rotation
  /// (Qwen3's QK-norm), one gain of head_dim each.
  bool qk_norm = false;
  /// attention.heads with kv_heads > 0: biases on the q, k and v
  /// projections only (Qwen2), whatever `bias` says of the output one.
  bool qkv_bias = false;
  /// rms_norm, norm.heads, and the QK-norm: the epsilon.
  double norm_eps = 1e-5;
  /// mlp and moe experts: "gelu" (fc1, gelu, fc2) or "swiglu" (down(silu(gate
  /// x) * up x), no biases).
  std::string activation = "gelu";
  /// linear.column: the output features come in indivisible units of this
  /// many (a key/value head's width); 0: any split. When the split degree
  /// exceeds the unit count, every unit is replicated on degree / units
  /// ranks (the count must divide the degree), each using its own unit.
  std::int64_t split_unit = 0;
  /// attention.heads: "eager" (the [batch, heads, seq, seq] scores) or
  /// "block" (block_causal_attention, include/hp/model/block_attention.h),
  /// and the block length of the latter.
  std::string attention = "eager";
  std::int64_t attention_block = 128;
  bool bias = true;
  double init_std = 0.02;
  double dropout = 0.0;
  /// linear.column: gather the split output back to full width.
  bool gather_output = true;
  /// linear.row: the input is already split along features.
  bool input_is_parallel = false;
  /// embedding.vocab / linear.column: reuse this shared tensor as the weight
  /// (tied embeddings); "" to create one.
  std::string tied_weight;
  /// moe: the mixture-of-experts options (in = hidden, out = expert width).
  std::shared_ptr<const MoeOptions> moe;

  LayerSpec& with_bias(bool b) { bias = b; return *this; }
  LayerSpec& with_gather_output(bool g) { gather_output = g; return *this; }
  LayerSpec& with_input_is_parallel(bool p) { input_is_parallel = p; return *this; }
  LayerSpec& with_init_std(double s) { init_std = s; return *this; }
  LayerSpec& with_tied_weight(std::string key) { tied_weight = std::move(key); return *this; }
  LayerSpec& with_dropout(double d) { dropout = d; return *this; }
  LayerSpec& with_split_unit(std::int64_t u) { split_unit = u; return *this; }
  LayerSpec& with_norm_eps(double e) { norm_eps = e; return *this; }
};

using LayerFactory = std::function<std::shared_ptr<Layer>(const LayerSpec&, BuildContext&)>;
using LossFactory = std::function<std::shared_ptr<LossLayer>(const LayerSpec&, BuildContext&)>;

/// Explicit, keyed registry. A kind can be replaced once, by one feature; a
/// second feature replacing the same kind is refused with both names. A
/// feature may instead *offer* an implementation: it is used unless another
/// feature replaces the kind outright, in either order (tensor_parallel
/// offers split experts for `moe`; expert_parallel replaces `moe`).
class LayerRegistry {
 public:
  /// The dense defaults for every kind.
  static LayerRegistry dense();

  void replace(const std::string& kind, const std::string& owner, LayerFactory factory);
  void offer(const std::string& kind, const std::string& owner, LayerFactory factory);
  void replace_loss(const std::string& kind, const std::string& owner, LossFactory factory);
  std::shared_ptr<Layer> make(const LayerSpec& spec, BuildContext& ctx) const;
  std::shared_ptr<LossLayer> make_loss(const LayerSpec& spec, BuildContext& ctx) const;
  /// Who provides `kind` ("dense" or a feature name).
  std::string owner(const std::string& kind) const;

 private:
  struct Entry {
    std::string owner;
    LayerFactory factory;
    bool offered = false;  ///< an offer, which a replacement overrides
  };
  struct LossEntry {
    std::string owner;
    LossFactory factory;
  };
  std::map<std::string, Entry> layers_;
  std::map<std::string, LossEntry> losses_;
};

/// Causal softmax attention over [batch, seq, heads, head_dim] q, k, v;
/// returns [batch, seq, heads * head_dim]. Shared by every attention layer.
/// `documents` ([batch, seq] int64), when defined, also hides every key of
/// another document than its query's (data.document_attention).
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& documents = at::Tensor());

/// Grouped-query attention's key/value heads for `heads` query heads:
/// [batch, seq, kv_heads, d] -> [batch, seq, heads, d], query head j using
/// key/value head j / (heads / kv_heads) (`kv` itself when they are equal).
/// Differentiable: the gradients of a shared head are summed.
at::Tensor repeat_kv(const at::Tensor& kv, std::int64_t heads);

/// Rotary position embedding (rotate-half convention: the first and second
/// halves of each head's d features are the pairs) of x [batch, seq, heads,
/// d] at global `positions` [seq] (int64) with base `theta`: x cos + rotate_half(x) sin,
/// computed in fp32, returned in x's type.
at::Tensor rotary(const at::Tensor& x, const at::Tensor& positions, double theta);

/// RMSNorm over the last dimension: x / sqrt(mean(x^2) + eps) * w, in fp32,
/// returned in x's type.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps);

}  // namespace hp
