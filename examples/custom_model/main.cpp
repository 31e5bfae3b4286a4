// A user's own model, written once from layer kinds (no parallel code),
// registered in the model registry from outside the tree exactly as the
// shipped models are, and trained with hp::Trainer::fit on a generated task.
// Any feature that replaces a kind (tensor parallel, ...) applies to it
// unchanged, and features check their splits against the sizes it states.
#include <cstdio>

#include "hp/model/layers.h"
#include "hp/model/model.h"
#include "framework/model/registry.h"
#include "framework/trainer/trainer.h"

namespace {

constexpr std::int64_t kVocab = 64, kHidden = 64, kLayers = 3;

class Embed : public hp::Block {
 public:
  explicit Embed(hp::BuildContext& ctx) {
    tok_ = register_module("tok", ctx.layers().make({"embedding.vocab", "embed.tok", kVocab, kHidden}, ctx));
  }
  hp::Activations forward(const hp::Activations& in) override {
    return hp::make_activations({{"h", tok_->forward(in["tokens"])}});
  }

 private:
  std::shared_ptr<hp::Layer> tok_;
};

/// A mixing block: causal attention and an MLP, each behind a LayerNorm.
class Mixer : public hp::Block {
 public:
  Mixer(hp::BuildContext& ctx, const std::string& name) {
    hp::LayerSpec attn{"attention.heads", name + ".attn", kHidden, kHidden};
    attn.heads = 4;
    ln1_ = register_module("ln1", ctx.layers().make({"layer_norm", name + ".ln1", kHidden}, ctx));
    attn_ = register_module("attn", ctx.layers().make(attn, ctx));
    ln2_ = register_module("ln2", ctx.layers().make({"layer_norm", name + ".ln2", kHidden}, ctx));
    mlp_ = register_module("mlp", ctx.layers().make({"mlp", name + ".mlp", kHidden, 2 * kHidden}, ctx));
  }
  hp::Activations forward(const hp::Activations& in) override {
    auto h = in["h"];
    h = h + attn_->forward(ln1_->forward(h));
    h = h + mlp_->forward(ln2_->forward(h));
    return hp::make_activations({{"h", h}});
  }

 private:
  std::shared_ptr<hp::Layer> ln1_, attn_, ln2_, mlp_;
};

class Head : public hp::Block {
 public:
  explicit Head(hp::BuildContext& ctx) {
    hp::LayerSpec out{"linear.column", "head.out", kHidden, kVocab};
    out.with_bias(false).with_gather_output(false).with_tied_weight("embed.tok.weight");
    out_ = register_module("out", ctx.layers().make(out, ctx));
  }
  hp::Activations forward(const hp::Activations& in) override {
    return hp::make_activations({{"logits", out_->forward(in["h"])}});
  }

 private:
  std::shared_ptr<hp::Layer> out_;
};

class Loss : public hp::LossBlock {
 public:
  explicit Loss(hp::BuildContext& ctx) {
    ce_ = register_module("ce", ctx.layers().make_loss({"loss.cross_entropy", "loss", 0, kVocab}, ctx));
  }
  hp::LossOutput forward(const hp::Activations& out, const hp::Activations& targets) override {
    return ce_->forward(out["logits"], targets["labels"]);
  }

 private:
  std::shared_ptr<hp::LossLayer> ce_;
};

hp::ModelDescription my_model(const hp::Config&) {
  hp::ModelDescription d;
  d.name = "mixer";
  d.blocks.push_back({"embed", {kVocab * kHidden, 0}, [](hp::BuildContext& c) { return std::make_shared<Embed>(c); }});
  for (int i = 0; i < kLayers; ++i) {
    std::string name = "blocks." + std::to_string(i);
    d.blocks.push_back({name, {12 * kHidden * kHidden, 24.0 * kHidden * kHidden},
                        [name](hp::BuildContext& c) { return std::make_shared<Mixer>(c, name); }});
  }
  d.blocks.push_back({"head", {0, 2.0 * kVocab * kHidden}, [](hp::BuildContext& c) { return std::make_shared<Head>(c); }});
  d.loss = [](hp::BuildContext& c) { return std::make_shared<Loss>(c); };
  return d;
}

void register_mixer() {
  hp::ModelEntry e;
  e.name = "mixer";
  e.doc = "the custom_model example: attention + MLP mixing blocks with a tied head";
  e.info = [](const hp::Config&) {
    hp::ModelInfo m;
    m.layer_kinds = {"embedding.vocab", "layer_norm", "attention.heads", "mlp", "linear.column", "linear.row",
                     "loss.cross_entropy"};
    m.split_sizes["heads"] = {4, "model.type", "the mixer's head count"};
    m.split_sizes["hidden"] = {kHidden, "model.type", "the mixer's width"};
    m.split_sizes["ffn"] = {2 * kHidden, "model.type", "the mixer's FFN width"};
    m.split_sizes["vocab"] = {kVocab, "model.type", "the mixer's vocabulary"};
    m.inputs = {"tokens"};
    m.shared_parameter_key = "model.type";  // its head is tied to the embedding
    return m;
  };
  e.describe = my_model;
  hp::models().add(std::move(e));
}

}  // namespace

int main(int argc, char** argv) {
  register_mixer();
  const std::string out_dir = argc > 1 ? argv[1] : "runs/custom_model";
  hp::Trainer trainer = hp::Trainer::from_yaml(R"(
model: {type: mixer, vocab_size: 64, seq_len: 32}
data: {type: synthetic}
training: {max_steps: 40, global_batch_size: 8, micro_batch_size: 4, log_interval: 10}
optimizer: {lr: 0.01, warmup_steps: 4}
)");
  trainer.set("run.output_dir", out_dir);
  trainer.enable("recompute", {{"granularity", "full"}});
  try {
    hp::FitResult r = trainer.fit();
    std::printf("custom_model: loss %.4f -> %.4f over %zu steps\n", r.losses.front(), r.losses.back(),
                r.losses.size());
    return r.losses.back() < 0.6 * r.losses.front() ? 0 : 1;
  } catch (const hp::ConfigException& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return hp::kConfigErrorExitCode;
  }
}
