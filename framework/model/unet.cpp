// `unet`: a skip-connection encoder-decoder over a 1-D field of grid points
// (in the style of Pangu-Weather's hierarchy): embedding, encoder, down-sample
// (neighbouring points merged, width doubled), middle, up-sample, a decoder
// whose first block consumes the encoder's output carried as "skip", and a
// recovery head back to the field's channels. Built only from layer kinds.
//
// The skip travels in the Activations of every block between the encoder
// and the decoder, so a pipeline stage boundary anywhere in between sends
// two tensors ("h" and "skip") of different shapes.
#include <ATen/ATen.h>

#include "hp/config/config.h"
#include "hp/config/schema.h"
#include "hp/model/layers.h"
#include "hp/model/model.h"
#include "framework/model/registry.h"

namespace hp {

namespace {

struct UnetDims {
  std::int64_t channels, hidden, layers, seq;
  double std;
};

/// h + mlp(ln(h)), width `w`.
class MlpResidual : public torch::nn::Module {
 public:
  MlpResidual(BuildContext& ctx, const std::string& name, std::int64_t w, double std) {
    ln_ = register_module("ln", ctx.layers().make(LayerSpec{"layer_norm", name + ".ln", w}, ctx));
    LayerSpec m{"mlp", name + ".mlp", w, 4 * w};
    m.with_init_std(std);
    mlp_ = register_module("mlp", ctx.layers().make(m, ctx));
  }
  at::Tensor forward(const at::Tensor& h) { return h + mlp_->forward(ln_->forward(h)); }

 private:
  std::shared_ptr<Layer> ln_, mlp_;
};

/// A full-width linear map (column split with the output gathered).
std::shared_ptr<Layer> dense_map(BuildContext& ctx, const std::string& name, std::int64_t in, std::int64_t out,
                                 double std) {
  LayerSpec s{"linear.column", name, in, out};
  s.with_init_std(std);
  return ctx.layers().make(s, ctx);
}

/// Carries "skip" through unchanged when present.
Activations with_skip(const Activations& in, at::Tensor h) {
  Activations out;
  out.insert("h", std::move(h));
  if (const at::Tensor* s = in.find("skip")) out.insert("skip", *s);
  return out;
}

class Embed : public Block {
 public:
  Embed(const UnetDims& d, BuildContext& ctx) {
    proj_ = register_module("proj", dense_map(ctx, "embed.proj", d.channels, d.hidden, d.std));
  }
  Activations forward(const Activations& in) override {
    return make_activations({{"h", proj_->forward(in["field"])}});
  }

 private:
  std::shared_ptr<Layer> proj_;
};

class Stage : public Block {
 public:
  Stage(BuildContext& ctx, const std::string& name, std::int64_t w, double std)
      : body_(register_module("body", std::make_shared<MlpResidual>(ctx, name, w, std))) {}
  Activations forward(const Activations& in) override { return with_skip(in, body_->forward(in["h"])); }

 private:
  std::shared_ptr<MlpResidual> body_;
};

/// [B, L, H] -> [B, L/2, 2H] (pairs of points merged, then mixed); the
/// encoder's output leaves as "skip".
class Down : public Block {
 public:
  Down(const UnetDims& d, BuildContext& ctx) : hidden_(d.hidden) {
    merge_ = register_module("merge", dense_map(ctx, "down.merge", 2 * d.hidden, 2 * d.hidden, d.std));
  }
  Activations forward(const Activations& in) override {
    const auto& h = in["h"];
    auto merged = h.reshape({h.size(0), h.size(1) / 2, 2 * hidden_});
    return make_activations({{"h", merge_->forward(merged)}, {"skip", h}});
  }

 private:
  std::int64_t hidden_;
  std::shared_ptr<Layer> merge_;
};

/// [B, L/2, 2H] -> [B, L, H].
class Up : public Block {
 public:
  Up(const UnetDims& d, BuildContext& ctx) : hidden_(d.hidden) {
    split_ = register_module("split", dense_map(ctx, "up.split", 2 * d.hidden, 2 * d.hidden, d.std));
  }
  Activations forward(const Activations& in) override {
    auto y = split_->forward(in["h"]);
    return with_skip(in, y.reshape({y.size(0), y.size(1) * 2, hidden_}));
  }

 private:
  std::int64_t hidden_;
  std::shared_ptr<Layer> split_;
};

/// First decoder block: fuses the up-sampled state with the skip.
class Fuse : public Block {
 public:
  Fuse(const UnetDims& d, BuildContext& ctx, const std::string& name) {
    fuse_ = register_module("fuse", dense_map(ctx, name + ".fuse", 2 * d.hidden, d.hidden, d.std));
    body_ = register_module("body", std::make_shared<MlpResidual>(ctx, name, d.hidden, d.std));
  }
  Activations forward(const Activations& in) override {
    auto h = fuse_->forward(at::cat({in["h"], in["skip"]}, -1));
    return make_activations({{"h", body_->forward(h)}});
  }

 private:
  std::shared_ptr<Layer> fuse_;
  std::shared_ptr<MlpResidual> body_;
};

class Recovery : public Block {
 public:
  Recovery(const UnetDims& d, BuildContext& ctx) {
    ln_ = register_module("ln", ctx.layers().make(LayerSpec{"layer_norm", "recovery.ln", d.hidden}, ctx));
    out_ = register_module("out", dense_map(ctx, "recovery.out", d.hidden, d.channels, d.std));
  }
  Activations forward(const Activations& in) override {
    return make_activations({{"pred", out_->forward(ln_->forward(in["h"]))}});
  }

 private:
  std::shared_ptr<Layer> ln_, out_;
};

/// Squared error summed over channels; one "token" per grid point.
class SquaredError : public LossBlock {
 public:
  LossOutput forward(const Activations& out, const Activations& targets) override {
    const auto& pred = out["pred"];
    return {(pred - targets["field"]).pow(2).sum(), pred.size(0) * pred.size(1)};
  }
};

BlockCost mlp_cost(std::int64_t w) { return {8 * w * w + 7 * w, 2.0 * 8 * w * w}; }

}  // namespace

namespace {
ModelDescription describe_unet(const Config& c) {
  UnetDims d{c.get_int("model.channels"), c.get_int("model.hidden"), c.get_int("model.layers"),
             c.get_int("model.seq_len"), c.get_float("model.init_std")};
  const std::int64_t H = d.hidden, C = d.channels;
  ModelDescription desc;
  desc.name = "unet";
  desc.blocks.push_back({"embed", {C * H + H, 2.0 * C * H}, [d](BuildContext& ctx) {
                           return std::make_shared<Embed>(d, ctx);
                         }});
  for (std::int64_t i = 0; i < d.layers; ++i) {
    const std::string name = "enc." + std::to_string(i);
    desc.blocks.push_back({name, mlp_cost(H), [d, name](BuildContext& ctx) {
                             return std::make_shared<Stage>(ctx, name, d.hidden, d.std);
                           }});
  }
  // Per grid point of the full-resolution field: half the points, twice the width.
  desc.blocks.push_back({"down", {4 * H * H + 2 * H, 4.0 * H * H}, [d](BuildContext& ctx) {
                           return std::make_shared<Down>(d, ctx);
                         }});
  for (std::int64_t i = 0; i < d.layers; ++i) {
    const std::string name = "mid." + std::to_string(i);
    const auto cost = mlp_cost(2 * H);
    desc.blocks.push_back({name, {cost.parameters, cost.flops_per_token / 2}, [d, name](BuildContext& ctx) {
                             return std::make_shared<Stage>(ctx, name, 2 * d.hidden, d.std);
                           }});
  }
  desc.blocks.push_back({"up", {4 * H * H + 2 * H, 4.0 * H * H}, [d](BuildContext& ctx) {
                           return std::make_shared<Up>(d, ctx);
                         }});
  for (std::int64_t i = 0; i < d.layers; ++i) {
    const std::string name = "dec." + std::to_string(i);
    auto cost = mlp_cost(H);
    if (i == 0) cost = {cost.parameters + 2 * H * H + H, cost.flops_per_token + 4.0 * H * H};
    desc.blocks.push_back({name, cost, [d, name, i](BuildContext& ctx) -> std::shared_ptr<Block> {
                             if (i == 0) return std::make_shared<Fuse>(d, ctx, name);
                             return std::make_shared<Stage>(ctx, name, d.hidden, d.std);
                           }});
  }
  desc.blocks.push_back({"recovery", {H * C + C + 2 * H, 2.0 * H * C}, [d](BuildContext& ctx) {
                           return std::make_shared<Recovery>(d, ctx);
                         }});
  desc.loss = [](BuildContext&) { return std::make_shared<SquaredError>(); };
  desc.loss_cost = {0, 3.0 * static_cast<double>(C)};
  return desc;
}

}  // namespace

void register_unet(ModelRegistry& r) {
  ModelEntry e;
  e.name = "unet";
  e.doc = "a skip-connection encoder-decoder over a field (needs data.type field)";
  e.declare_options = [](Schema& s) {
    declare_once(s, "model.channels", [](Schema& sc) {
      sc.add_int("model.channels", 4).range(1, 4096)
          .describe("unet: channels of the field at each of model.seq_len grid points.");
    });
  };
  e.validate = [](const Config& c, ConfigErrors& errors) {
    if (c.ok({"model.seq_len"}) && c.get_int("model.seq_len") % 2 != 0) {
      errors.add("model.seq_len", std::to_string(c.get_int("model.seq_len")),
                 "unet halves the grid in its down-sample block, so it must be even", "an even number");
    }
  };
  e.info = [](const Config& c) {
    ModelInfo m;
    m.name = "unet";
    m.layer_kinds = {"linear.column", "linear.row", "layer_norm", "mlp"};
    const auto H = c.get_int("model.hidden");
    // Widths H, 2H and FFNs 4H, 8H: a split of H and 4H divides them all.
    // No sequence size: the grid is reshaped by the down/up-sampling.
    m.split_sizes["hidden"] = {H, "model.hidden", "the hidden size"};
    m.split_sizes["ffn"] = {4 * H, "model.hidden", "the FFN size (4 x model.hidden)"};
    m.split_sizes["blocks"] = {3 * c.get_int("model.layers") + 4, "model.layers", "the block count"};
    m.inputs = {"field"};
    m.free_keys = {"model.init_std"};  // a resume overwrites every weight
    // Per grid point: forward as the blocks declare it, backward twice that.
    const ModelDescription desc = describe_unet(c);
    double forward = desc.loss_cost.flops_per_token;
    for (const auto& b : desc.blocks) forward += b.cost.flops_per_token;
    m.train_flops_per_token = 3 * forward;
    return m;
  };
  e.describe = describe_unet;
  r.add(std::move(e));
}

}  // namespace hp
