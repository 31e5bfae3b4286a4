// The shipped models, built only from layer kinds: `gpt` (pre-LayerNorm
// decoder), `mlp` (the same without attention) and `llama` (pre-RMSNorm
// decoder with rotary positions, SwiGLU and grouped-query attention), and
// the model registry they (and unet) are registered in.
#include <ATen/ATen.h>

#include <stdexcept>

#include "hp/profile/trace.h"
#include "hp/config/config.h"
#include "hp/config/schema.h"
#include "hp/model/block_attention.h"
#include "hp/model/layers.h"
#include "hp/model/model.h"
#include "hp/model/moe.h"
#include "framework/model/registry.h"

namespace hp {

namespace {

/// The decoder kinds built here.
enum class Decoder { kGpt, kMlp, kLlama };
const char* name_of(Decoder k) { return k == Decoder::kGpt ? "gpt" : k == Decoder::kMlp ? "mlp" : "llama"; }

struct Dims {
  Decoder kind = Decoder::kGpt;
  std::int64_t vocab, hidden, heads, ffn, seq, layers;
  std::int64_t kv_heads = 0;  ///< llama: key/value heads (= heads: multi-head)
  double rope_theta = 0, norm_eps = 1e-5;
  bool qk_norm = false, qkv_bias = false;
  bool has_attention() const { return kind != Decoder::kMlp; }
  bool llama() const { return kind == Decoder::kLlama; }
  std::string attention;  ///< "eager" or "block" (model.attention: auto resolved)
  std::int64_t attention_block = 128;
  double std, dropout;
  bool tied;
  std::shared_ptr<const MoeOptions> moe;  ///< null: dense FFNs
  std::int64_t expert_ffn = 0;
  bool moe_block(std::int64_t i) const { return moe && i % moe->every == 0; }
};

Dims dims_of(const Config& c, Decoder kind) {
  Dims d;
  d.kind = kind;
  d.vocab = c.get_int("model.vocab_size");
  d.hidden = c.get_int("model.hidden");
  d.heads = c.get_int("model.heads");
  d.attention_block = c.get_int("model.attention_block");
  const std::int64_t ffn = c.get_int("model.ffn_hidden");
  d.ffn = ffn != 0 ? ffn : d.llama() ? llama_ffn_width(d.hidden) : 4 * d.hidden;
  if (d.llama()) {
    d.kv_heads = c.get_int("model.kv_heads") == 0 ? d.heads : c.get_int("model.kv_heads");
    d.rope_theta = c.get_float("model.rope_theta");
    d.norm_eps = c.get_float("model.norm_eps");
    d.qk_norm = c.get_bool("model.qk_norm");
    d.qkv_bias = c.get_bool("model.qkv_bias");
  }
  d.seq = c.get_int("model.seq_len");
  d.attention = resolve_attention(c.get_string("model.attention"), d.seq, c.get_int("model.attention_auto_seq"));
  d.layers = c.get_int("model.layers");
  d.std = c.get_float("model.init_std");
  d.dropout = c.get_float("model.dropout");
  d.tied = c.get_bool("model.tie_embeddings");
  const MoeOptions mo = MoeOptions::from(c);
  if (mo.enabled()) {
    d.moe = std::make_shared<const MoeOptions>(mo);
    d.expert_ffn = mo.ffn_hidden > 0 ? mo.ffn_hidden : d.ffn;
  }
  return d;
}

/// The block's normalisation: LayerNorm (gpt, mlp) or RMSNorm (llama).
LayerSpec norm(const Dims& d, const std::string& name) {
  LayerSpec n{d.llama() ? "rms_norm" : "layer_norm", name, d.hidden};
  return n.with_norm_eps(d.norm_eps);
}

class EmbedBlock : public Block {
 public:
  EmbedBlock(const Dims& d, BuildContext& ctx) {
    LayerSpec tok{"embedding.vocab", "embed.tok", d.vocab, d.hidden};
    tok.with_init_std(d.std);
    tok_ = register_module("tok", ctx.layers().make(tok, ctx));
    if (!d.llama()) {  // llama: rotary positions in attention instead of a table
      LayerSpec pos{"embedding.position", "embed.pos", d.seq, d.hidden};
      pos.with_init_std(d.std);
      pos_ = register_module("pos", ctx.layers().make(pos, ctx));
    }
    drop_ = register_module("drop", ctx.layers().make(LayerSpec{"dropout", "embed.drop"}.with_dropout(d.dropout), ctx));
  }
  Activations forward(const Activations& in) override {
    const auto& ids = in["tokens"];
    at::Tensor h = tok_->forward(ids);
    if (pos_) h = pos_->forward(h);
    return make_activations({{"h", drop_->forward(h)}});
  }

 private:
  std::shared_ptr<Layer> tok_, pos_, drop_;
};

class ResidualBlock : public Block {
 public:
  ResidualBlock(const Dims& d, BuildContext& ctx, const std::string& name, bool attention, bool moe) {
    const std::int64_t H = d.hidden, F = d.ffn;
    // One dropout layer per use: a layer's mask is keyed by its name.
    drop2_ = register_module("drop", ctx.layers().make(LayerSpec{"dropout", name + ".drop"}.with_dropout(d.dropout), ctx));
    if (attention) {
      drop1_ = register_module(
          "attn_drop", ctx.layers().make(LayerSpec{"dropout", name + ".attn_drop"}.with_dropout(d.dropout), ctx));
      ln1_ = register_module("ln1", ctx.layers().make(norm(d, name + ".ln1"), ctx));
      LayerSpec a{"attention.heads", name + ".attn", H, H};
      a.heads = d.heads;
      a.attention = d.attention;
      a.attention_block = d.attention_block;
      a.with_init_std(d.std);
      if (d.llama()) {
        a.kv_heads = d.kv_heads;
        a.rope_theta = d.rope_theta;
        a.qk_norm = d.qk_norm;
        a.qkv_bias = d.qkv_bias;
        a.with_norm_eps(d.norm_eps).with_bias(false);
      }
      attn_ = register_module("attn", ctx.layers().make(a, ctx));
    }
    ln2_ = register_module("ln2", ctx.layers().make(norm(d, name + ".ln2"), ctx));
    LayerSpec m{"mlp", name + ".mlp", H, F};
    if (moe) {
      m = LayerSpec{"moe", name + ".moe", H, d.expert_ffn};
      m.moe = d.moe;
    }
    m.with_init_std(d.std);
    if (d.llama()) {
      m.activation = "swiglu";
      m.with_bias(false);
    }
    mlp_ = register_module("mlp", ctx.layers().make(m, ctx));
  }
  Activations forward(const Activations& in) override {
    auto h = in["h"];
    if (attn_) h = h + drop1_->forward(attn_->forward(ln1_->forward(h)));
    at::Tensor f;
    {
      profile::Span span("compute", "ffn");  // the FFN's forward, for traces beside an MoE layer's spans
      f = mlp_->forward(ln2_->forward(h));
    }
    h = h + drop2_->forward(f);
    return make_activations({{"h", h}});
  }

 private:
  std::shared_ptr<Layer> ln1_, attn_, ln2_, mlp_, drop1_, drop2_;
};

class HeadBlock : public Block {
 public:
  HeadBlock(const Dims& d, BuildContext& ctx) {
    ln_ = register_module("ln", ctx.layers().make(norm(d, "head.ln"), ctx));
    LayerSpec out{"linear.column", "head.out", d.hidden, d.vocab};
    // Logits stay split over the vocabulary when a feature splits it; the
    // loss kind knows how to reduce them.
    out.with_bias(false).with_gather_output(false).with_init_std(d.std);
    if (d.tied) out.with_tied_weight("embed.tok.weight");
    out_ = register_module("out", ctx.layers().make(out, ctx));
  }
  Activations forward(const Activations& in) override {
    return make_activations({{"logits", out_->forward(ln_->forward(in["h"]))}});
  }

 private:
  std::shared_ptr<Layer> ln_, out_;
};

class CrossEntropyBlock : public LossBlock {
 public:
  CrossEntropyBlock(BuildContext& ctx, std::int64_t vocab) {
    loss_ = register_module("ce", ctx.layers().make_loss(LayerSpec{"loss.cross_entropy", "loss", 0, vocab}, ctx));
  }
  LossOutput forward(const Activations& out, const Activations& targets) override {
    return loss_->forward(out["logits"], targets["labels"]);
  }
  std::string logits_name() const override { return "logits"; }
  at::Tensor log_probs(const at::Tensor& rows) override { return loss_->log_probs(rows); }
  at::Tensor gather_samples(const at::Tensor& t) override { return loss_->gather_samples(t); }

 private:
  std::shared_ptr<LossLayer> loss_;
};

/// Per block: the FFN's weight count for width `f` (gelu: fc1, fc2 and
/// their biases; swiglu: gate, up and down, no biases), and the attention
/// projections' (gpt: 4 h^2 and biases; llama: q and proj h^2 each, k and v
/// h x the key/value width, the QK-norm gains).
std::int64_t ffn_params(const Dims& d, std::int64_t f) {
  return d.llama() ? 3 * d.hidden * f : 2 * d.hidden * f + f + d.hidden;
}
std::int64_t attention_params(const Dims& d) {
  const std::int64_t H = d.hidden;
  if (!d.llama()) return 4 * H * H + 4 * H;
  const std::int64_t head_dim = H / d.heads;
  return 2 * H * H + 2 * H * d.kv_heads * head_dim + (d.qk_norm ? 2 * head_dim : 0) +
         (d.qkv_bias ? H + 2 * d.kv_heads * head_dim : 0);
}
/// The multiply-adds per token of those weights (biases and gains not counted).
double ffn_macs(const Dims& d, std::int64_t f) { return static_cast<double>((d.llama() ? 3 : 2) * d.hidden * f); }
double attention_macs(const Dims& d) {
  const std::int64_t H = d.hidden;
  return d.llama() ? static_cast<double>(2 * H * H + 2 * H * d.kv_heads * (H / d.heads)) : 4.0 * H * H;
}

BlockCost estimate(const Dims& d, const std::string& which, bool moe = false) {
  // Costs are needed before blocks are built, to place them on stages.
  const std::int64_t H = d.hidden, F = d.ffn;
  const std::int64_t norms = d.llama() ? H : 2 * H;  // one norm's gain (and bias)
  if (which == "embed") return {d.vocab * H + (d.llama() ? 0 : d.seq * H), 2.0 * H};
  if (which == "head") return {d.vocab * H + norms, 2.0 * d.vocab * H};
  std::int64_t params = ffn_params(d, F) + 2 * norms;
  double flops = 2.0 * ffn_macs(d, F);
  if (moe) {
    // Router, k routed experts and the shared ones per token; all experts' parameters.
    const std::int64_t E = d.moe->num_experts, Fe = d.expert_ffn, S = d.moe->shared_experts;
    params = E * H + (E + S) * ffn_params(d, Fe) + 2 * norms;
    flops = 2.0 * H * E + 2.0 * ffn_macs(d, Fe) * static_cast<double>(d.moe->top_k + S);
  }
  if (d.has_attention()) {
    params += attention_params(d);
    flops += 2.0 * attention_macs(d) + 2.0 * d.seq * H;  // projections + causal scores and values
  }
  return {params, flops};
}

ModelDescription describe_decoder(const Config& config, Decoder kind) {
  const Dims d = dims_of(config, kind);
  ModelDescription desc;
  desc.name = name_of(kind);
  desc.blocks.push_back({"embed", estimate(d, "embed"),
                         [d](BuildContext& ctx) { return std::make_shared<EmbedBlock>(d, ctx); }});
  for (std::int64_t i = 0; i < d.layers; ++i) {
    const std::string name = "blocks." + std::to_string(i);
    const bool moe = d.moe_block(i);
    desc.blocks.push_back({name, estimate(d, "block", moe), [d, name, moe](BuildContext& ctx) {
                             return std::make_shared<ResidualBlock>(d, ctx, name, d.has_attention(), moe);
                           }});
  }
  desc.blocks.push_back({"head", estimate(d, "head"),
                         [d](BuildContext& ctx) { return std::make_shared<HeadBlock>(d, ctx); }});
  desc.loss = [vocab = d.vocab](BuildContext& ctx) { return std::make_shared<CrossEntropyBlock>(ctx, vocab); };
  desc.loss_cost = {0, 4.0 * static_cast<double>(d.vocab)};  // max, exp, sum and log over the vocabulary
  if (d.moe) {
    desc.aux_losses = {"load_balance", "router_z"};
    if (d.moe->device_balance_coef > 0) desc.aux_losses.push_back("device_balance");
  }
  return desc;
}

void declare_decoder_options(Schema& s) {
  declare_once(s, "model.layers", [](Schema& sc) {
    sc.add_int("model.layers", 4).range(1, 1024).describe("Number of transformer blocks (or MLP blocks).");
  });
  declare_once(s, "model.hidden", [](Schema& sc) {
    sc.add_int("model.hidden", 256).range(1, 65536).describe("Hidden (model) width.");
  });
  declare_once(s, "model.heads", [](Schema& sc) {
    sc.add_int("model.heads", 4).range(1, 1024).describe("Attention heads; must divide model.hidden.");
  });
  declare_once(s, "model.ffn_hidden", [](Schema& sc) {
    sc.add_int("model.ffn_hidden", 0)
        .range(0, 262144)
        .describe("Inner width of the MLP.")
        .note("0 means 4 x model.hidden (llama: 8/3 x model.hidden rounded up to a multiple of 256)");
  });
  declare_once(s, "model.vocab_size", [](Schema& sc) {
    sc.add_int("model.vocab_size", 256).range(2, 16777216).describe("Vocabulary size (256 for byte-level text).");
  });
  declare_once(s, "model.tie_embeddings", [](Schema& sc) {
    sc.add_bool("model.tie_embeddings", false).describe("Share the token embedding with the output head.");
  });
  declare_once(s, "model.dropout", [](Schema& sc) {
    sc.add_float("model.dropout", 0.0).range(0.0, 0.9).describe("Dropout probability.");
  });
  declare_once(s, "model.attention", [](Schema& sc) {
    sc.add_enum("model.attention", "auto", {"auto", "eager", "block"})
        .describe("How the gpt computes causal attention: eager forms the [batch, heads, seq, seq] scores; "
                  "block walks key blocks with an online softmax and never forms them (the results of "
                  "eager up to fp32 rounding; memory linear in seq); auto is block when model.seq_len >= "
                  "model.attention_auto_seq, else eager.");
  });
  declare_once(s, "model.attention_auto_seq", [](Schema& sc) {
    sc.add_int("model.attention_auto_seq", kAutoBlockSeq)
        .range(1, 1073741824)
        .describe("Shortest model.seq_len at which model.attention: auto picks block attention "
                  "(docs/rfc/0011-block-attention.md: the measured crossover).");
  });
  declare_once(s, "model.attention_block", [](Schema& sc) {
    sc.add_int("model.attention_block", 128)
        .range(1, 1048576)
        .describe("Query and key block length of model.attention: block; need not divide model.seq_len.");
  });
  declare_moe_options(s);
}

void declare_llama_options(Schema& s) {
  declare_decoder_options(s);
  s.add_int("model.kv_heads", 0)
      .range(0, 1024)
      .describe("llama: key/value heads of grouped-query attention; a divisor of model.heads (1: multi-query).")
      .note("0 means model.heads (multi-head attention)");
  s.add_float("model.rope_theta", 10000.0)
      .range(1.0, 1e12)
      .describe("llama: base of the rotary position embedding (Llama 2: 10000, Llama 3: 500000).");
  s.add_float("model.norm_eps", 1e-5).range(1e-12, 1.0).describe("llama: epsilon of every RMSNorm.");
  s.add_bool("model.qk_norm", false)
      .describe("llama: RMSNorm of queries and keys per head before the rotation (Qwen3's QK-norm).");
  s.add_bool("model.qkv_bias", false).describe("llama: biases on the q, k and v projections (Qwen2).");
}

// Training FLOPs per token the standard way (Kaplan et al., PaLM appendix B,
// Megatron): 6 N for the weights a token multiplies (2 forward, 4 backward),
// N = per layer the attention projections 4 h^2 and the FFN 2 h f (a MoE
// layer: its router and the top_k + shared experts a token visits), and the
// output head V h; the embedding lookups are not multiplications. Attention
// adds 12 L h s: scores and values, 2 x 2 s h forward per layer, times 3,
// counted over the full square as the convention does (the causal mask
// halves the useful part; declared block costs count that half).
// A llama block's projections are q and proj (h^2 each) and k and v (h x
// the key/value width), its FFN 3 h f (gate, up, down).
double decoder_train_flops_per_token(const Dims& d) {
  const double H = static_cast<double>(d.hidden);
  double n = static_cast<double>(d.vocab) * H;
  for (std::int64_t i = 0; i < d.layers; ++i) {
    if (d.has_attention()) n += attention_macs(d);
    if (d.moe_block(i)) {
      n += H * static_cast<double>(d.moe->num_experts) +
           ffn_macs(d, d.expert_ffn) * static_cast<double>(d.moe->top_k + d.moe->shared_experts);
    } else {
      n += ffn_macs(d, d.ffn);
    }
  }
  double flops = 6 * n;
  if (d.has_attention()) flops += 12.0 * static_cast<double>(d.layers) * H * static_cast<double>(d.seq);
  return flops;
}

ModelInfo decoder_info(const Config& c, Decoder kind) {
  const Dims d = dims_of(c, kind);
  const bool attention = d.has_attention();
  ModelInfo m;
  m.name = name_of(kind);
  m.layer_kinds = {"embedding.vocab", "dropout", "linear.column", "linear.row", "loss.cross_entropy"};
  // A dense FFN: a block without experts, or a MoE layer's shared experts.
  bool dense = !d.moe || d.moe->shared_experts > 0;
  for (std::int64_t i = 0; i < d.layers && !dense; ++i) dense = !d.moe_block(i);
  if (dense) m.layer_kinds.insert("mlp");
  if (d.llama()) {
    m.layer_kinds.insert("rms_norm");
    if (d.qk_norm) m.layer_kinds.insert("norm.heads");
  } else {
    m.layer_kinds.insert({"embedding.position", "layer_norm"});
  }
  if (attention) {
    m.layer_kinds.insert("attention.heads");
    m.split_sizes["heads"] = {d.heads, "model.heads", "the head count"};
  }
  if (d.llama()) m.split_sizes["kv_heads"] = {d.kv_heads, "model.kv_heads", "the key/value head count"};
  m.split_sizes["hidden"] = {d.hidden, "model.hidden", "the hidden size"};
  m.split_sizes["ffn"] = {d.ffn, "model.ffn_hidden", "the FFN size"};
  m.split_sizes["vocab"] = {d.vocab, "model.vocab_size", "the vocabulary"};
  m.split_sizes["sequence"] = {d.seq, "model.seq_len", "the sequence length"};
  m.split_sizes["blocks"] = {d.layers + 2, "model.layers", "the block count"};
  m.split_sizes["layers"] = {d.layers, "model.layers", "the transformer block count"};
  m.inputs = {"tokens"};
  // Free at a resume: regularisation, initialisation (a resume overwrites
  // every weight) and the MoE loss weights and token-drop policy; none
  // changes a tensor's shape or meaning. How the experts are computed
  // (packed, slices, padded) is the same function up to fp32 rounding.
  m.free_keys = {"model.dropout", "model.init_std", "model.moe.aux_loss_coef", "model.moe.z_loss_coef",
                 "model.moe.device_balance_coef", "model.moe.device_groups",
                 "model.moe.capacity_factor", "model.moe.expert_compute"};
  // The attention algorithm computes the same function (up to fp32 rounding).
  if (attention) m.free_keys.insert({"model.attention", "model.attention_block", "model.attention_auto_seq"});
  // Rotary positions have no table: the sequence length and the rotary
  // base (a context extension) change no tensor.
  if (d.llama()) m.free_keys.insert({"model.seq_len", "model.rope_theta", "model.norm_eps"});
  m.train_flops_per_token = decoder_train_flops_per_token(d);
  if (d.tied) m.shared_parameter_key = "model.tie_embeddings";
  if (d.moe) {
    m.layer_kinds.insert("moe");
    m.split_sizes["experts"] = {d.moe->num_experts, "model.moe.num_experts", "the expert count"};
    m.split_sizes["expert_ffn"] = {d.expert_ffn, "model.moe.ffn_hidden", "the expert FFN width"};
    m.expert_rows_per_token = static_cast<int>(d.moe->top_k);
  }
  return m;
}

void register_decoder(ModelRegistry& r, Decoder kind) {
  ModelEntry e;
  e.name = name_of(kind);
  e.doc = kind == Decoder::kGpt   ? "pre-LayerNorm decoder transformer (GPT-2)"
          : kind == Decoder::kMlp ? "the gpt without attention"
                                  : "pre-RMSNorm decoder with rotary positions, SwiGLU and grouped-query attention "
                                    "(Llama, Qwen, Mistral)";
  e.declare_options = kind == Decoder::kLlama ? declare_llama_options : declare_decoder_options;
  e.validate = [kind](const Config& c, ConfigErrors& errors) {
    validate_moe_options(c, errors);
    if (kind == Decoder::kMlp || !c.ok({"model.hidden", "model.heads"})) return;
    const auto h = c.get_int("model.hidden"), n = c.get_int("model.heads");
    if (h % n != 0) {
      errors.add("model.heads", std::to_string(n), "must divide model.hidden = " + std::to_string(h),
                 "a divisor of " + std::to_string(h));
      return;
    }
    if (kind != Decoder::kLlama || !c.ok({"model.kv_heads"})) return;
    if ((h / n) % 2 != 0) {
      errors.add("model.heads", std::to_string(n),
                 "the head width model.hidden / model.heads = " + std::to_string(h / n) +
                     " must be even (rotary embeddings rotate pairs of features)",
                 "a head count that leaves an even head width");
    }
    const auto kv = c.get_int("model.kv_heads");
    if (kv != 0 && (kv > n || n % kv != 0)) {
      errors.add("model.kv_heads", std::to_string(kv),
                 "must divide model.heads = " + std::to_string(n) + " (each key/value head serves a group of query heads)",
                 "0 (= model.heads) or a divisor of " + std::to_string(n));
    }
  };
  e.info = [kind](const Config& c) { return decoder_info(c, kind); };
  e.describe = [kind](const Config& c) { return describe_decoder(c, kind); };
  r.add(std::move(e));
}

}  // namespace

void register_unet(ModelRegistry& r);  // unet.cpp

std::int64_t llama_ffn_width(std::int64_t hidden) {
  const std::int64_t f = 2 * (4 * hidden) / 3;
  return (f + 255) / 256 * 256;
}

void declare_once(Schema& schema, const std::string& path, const std::function<void(Schema&)>& declare) {
  if (!schema.find(path)) declare(schema);
}

ModelRegistry& models() {
  static ModelRegistry* r = [] {
    auto* reg = new ModelRegistry("model");
    register_decoder(*reg, Decoder::kGpt);
    register_decoder(*reg, Decoder::kMlp);
    register_decoder(*reg, Decoder::kLlama);
    register_unet(*reg);
    return reg;
  }();
  return *r;
}

ModelInfo model_info(const Config& config) {
  const ModelEntry& e = models().get(config.get_string("model.type"));
  ModelInfo m = e.info(config);
  if (m.name.empty()) m.name = e.name;
  const ModelDescription d = e.describe(config);
  m.block_flops.clear();
  for (const auto& b : d.blocks) m.block_flops.push_back(b.cost.flops_per_token);
  m.loss_flops = d.loss_cost.flops_per_token;
  if (m.train_flops_per_token <= 0) {
    double forward = m.loss_flops;
    for (double f : m.block_flops) forward += f;
    m.train_flops_per_token = 3 * forward;  // backward costs about twice the forward
  }
  return m;
}

ModelDescription describe_model(const Config& config) { return models().get(config.get_string("model.type")).describe(config); }

}  // namespace hp
