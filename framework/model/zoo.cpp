// The shipped models, built only from layer kinds: `gpt` (pre-LayerNorm
// decoder) and `mlp` (the same without attention).
#include <ATen/ATen.h>

#include <stdexcept>

#include "framework/config/config.h"
#include "framework/model/layers.h"
#include "framework/model/model.h"

namespace hp {

namespace {

struct Dims {
  std::int64_t vocab, hidden, heads, ffn, seq, layers;
  double std, dropout;
  bool tied;
};

Dims dims_of(const Config& c) {
  Dims d;
  d.vocab = c.get_int("model.vocab_size");
  d.hidden = c.get_int("model.hidden");
  d.heads = c.get_int("model.heads");
  d.ffn = c.get_int("model.ffn_hidden") == 0 ? 4 * d.hidden : c.get_int("model.ffn_hidden");
  d.seq = c.get_int("model.seq_len");
  d.layers = c.get_int("model.layers");
  d.std = c.get_float("model.init_std");
  d.dropout = c.get_float("model.dropout");
  d.tied = c.get_bool("model.tie_embeddings");
  return d;
}

class EmbedBlock : public Block {
 public:
  EmbedBlock(const Dims& d, BuildContext& ctx) {
    LayerSpec tok{"embedding.vocab", "embed.tok", d.vocab, d.hidden};
    tok.with_init_std(d.std);
    tok_ = register_module("tok", ctx.layers().make(tok, ctx));
    LayerSpec pos{"embedding.position", "embed.pos", d.seq, d.hidden};
    pos.with_init_std(d.std);
    pos_ = register_module("pos", ctx.layers().make(pos, ctx));
    drop_ = register_module("drop", ctx.layers().make(LayerSpec{"dropout", "embed.drop"}.with_dropout(d.dropout), ctx));
  }
  Activations forward(const Activations& in) override {
    const auto& ids = in["tokens"];
    return make_activations({{"h", drop_->forward(pos_->forward(tok_->forward(ids)))}});
  }

 private:
  std::shared_ptr<Layer> tok_, pos_, drop_;
};

class ResidualBlock : public Block {
 public:
  ResidualBlock(const Dims& d, BuildContext& ctx, const std::string& name, bool attention) {
    const std::int64_t H = d.hidden, F = d.ffn;
    drop_ = register_module("drop", ctx.layers().make(LayerSpec{"dropout", name + ".drop"}.with_dropout(d.dropout), ctx));
    if (attention) {
      ln1_ = register_module("ln1", ctx.layers().make(LayerSpec{"layer_norm", name + ".ln1", H}, ctx));
      LayerSpec a{"attention.heads", name + ".attn", H, H};
      a.heads = d.heads;
      a.with_init_std(d.std);
      attn_ = register_module("attn", ctx.layers().make(a, ctx));
    }
    ln2_ = register_module("ln2", ctx.layers().make(LayerSpec{"layer_norm", name + ".ln2", H}, ctx));
    LayerSpec m{"mlp", name + ".mlp", H, F};
    m.with_init_std(d.std);
    mlp_ = register_module("mlp", ctx.layers().make(m, ctx));
  }
  Activations forward(const Activations& in) override {
    auto h = in["h"];
    if (attn_) h = h + drop_->forward(attn_->forward(ln1_->forward(h)));
    h = h + drop_->forward(mlp_->forward(ln2_->forward(h)));
    return make_activations({{"h", h}});
  }

 private:
  std::shared_ptr<Layer> ln1_, attn_, ln2_, mlp_, drop_;
};

class HeadBlock : public Block {
 public:
  HeadBlock(const Dims& d, BuildContext& ctx) {
    ln_ = register_module("ln", ctx.layers().make(LayerSpec{"layer_norm", "head.ln", d.hidden}, ctx));
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
  explicit CrossEntropyBlock(BuildContext& ctx) {
    loss_ = register_module("ce", ctx.layers().make_loss(LayerSpec{"loss.cross_entropy", "loss"}, ctx));
  }
  LossOutput forward(const Activations& out, const at::Tensor& targets) override {
    return loss_->forward(out["logits"], targets);
  }

 private:
  std::shared_ptr<LossLayer> loss_;
};

BlockCost estimate(const Dims& d, bool attention, const std::string& which) {
  // Costs are needed before blocks are built, to place them on stages.
  const std::int64_t H = d.hidden, F = d.ffn;
  if (which == "embed") return {d.vocab * H + d.seq * H, 2.0 * H};
  if (which == "head") return {d.vocab * H + 2 * H, 2.0 * d.vocab * H};
  std::int64_t params = 2 * H * F + F + H + 4 * H;
  double flops = 2.0 * (2 * H * F);
  if (attention) {
    params += 4 * H * H + 4 * H;
    flops += 2.0 * 4 * H * H + 2.0 * d.seq * H;  // projections + causal scores and values
  }
  return {params, flops};
}

}  // namespace

ModelDescription describe_unet(const Config& config);  // unet.cpp

ModelDescription describe_model(const Config& config) {
  if (config.get_string("model.type") == "unet") return describe_unet(config);
  const Dims d = dims_of(config);
  const std::string type = config.get_string("model.type");
  const bool attention = type == "gpt";
  ModelDescription desc;
  desc.name = type;
  desc.blocks.push_back({"embed", estimate(d, attention, "embed"),
                         [d](BuildContext& ctx) { return std::make_shared<EmbedBlock>(d, ctx); }});
  for (std::int64_t i = 0; i < d.layers; ++i) {
    const std::string name = "blocks." + std::to_string(i);
    desc.blocks.push_back({name, estimate(d, attention, "block"), [d, name, attention](BuildContext& ctx) {
                             return std::make_shared<ResidualBlock>(d, ctx, name, attention);
                           }});
  }
  desc.blocks.push_back({"head", estimate(d, attention, "head"),
                         [d](BuildContext& ctx) { return std::make_shared<HeadBlock>(d, ctx); }});
  desc.loss = [](BuildContext& ctx) { return std::make_shared<CrossEntropyBlock>(ctx); };
  desc.loss_cost = {0, 4.0 * static_cast<double>(d.vocab)};  // max, exp, sum and log over the vocabulary
  return desc;
}

}  // namespace hp
