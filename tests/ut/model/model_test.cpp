// Models, datasets and the single-rank context: registries and the rules a
// model states (checked by features that do not know the model), datasets
// as pure functions, layout-independent initial values, auxiliary losses.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hp/comm/context.h"
#include "hp/config/config.h"
#include "hp/data/dataset.h"
#include "framework/data/registry.h"
#include "hp/model/aux_loss.h"
#include "hp/model/extensions.h"
#include "hp/model/layers.h"
#include "hp/model/model.h"
#include "framework/model/registry.h"
#include "framework/runtime/setup.h"
#include "hp/trainer/executor.h"

namespace {

hp::dist::DistributedContext& one() {
  static auto ctx = hp::dist::DistributedContext::single();
  return *ctx;
}

std::string config_errors(const std::string& yaml, int world = 1) {
  try {
    hp::prepare(hp::RawConfig::parse_string(yaml, "t.yaml"), world);
  } catch (const hp::ConfigException& e) {
    return e.what();
  }
  return "";
}

/// A model only this test knows: it states heads = 3 and a hidden size of
/// 12; tensor_parallel must refuse size 2 from those statements alone.
void register_odd_model() {
  if (hp::models().find("odd_heads")) return;
  hp::ModelEntry e;
  e.name = "odd_heads";
  e.doc = "test model with three heads";
  e.info = [](const hp::Config&) {
    hp::ModelInfo m;
    m.layer_kinds = {"attention.heads"};
    m.split_sizes["heads"] = {3, "model.type", "the head count of odd_heads"};
    m.split_sizes["hidden"] = {12, "model.type", "the width of odd_heads"};
    m.inputs = {"tokens"};
    return m;
  };
  e.describe = [](const hp::Config&) { return hp::ModelDescription{}; };
  hp::models().add(std::move(e));
}

}  // namespace

TEST(SingleRankContext, EveryGroupHasOneMemberAndCollectivesAreLocal) {
  auto ctx = hp::dist::DistributedContext::single();
  EXPECT_EQ(ctx->world_size(), 1);
  EXPECT_EQ(ctx->rank(), 0);
  for (const auto& name : ctx->mesh().group_names()) EXPECT_EQ(ctx->group(name).size(), 1) << name;
  EXPECT_EQ(ctx->group(hp::dist::MeshRole::kPartition).size(), 1);
  auto t = torch::full({2}, 3.0);
  ctx->group(hp::dist::MeshRole::kReplicate).all_reduce(t);
  EXPECT_TRUE(torch::equal(t, torch::full({2}, 3.0)));
  EXPECT_EQ(ctx->mesh().leaders(), std::vector<int>{0});
}

TEST(ModelRegistry, ShippedModelsAndDuplicateRefused) {
  const auto names = hp::models().names();
  for (const char* n : {"gpt", "mlp", "unet"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  }
  hp::ModelEntry dup;
  dup.name = "gpt";
  try {
    hp::models().add(dup);
    FAIL() << "a second 'gpt' was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "model 'gpt' is registered twice");
  }
  try {
    hp::models().get("nope");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("no model named 'nope' (registered: gpt, mlp, llama, unet"), std::string::npos)
        << e.what();
  }
}

TEST(ModelRegistry, GptStatesItsSplitSizesAndKinds) {
  auto s = hp::prepare(hp::RawConfig::parse_string("data: {type: synthetic}\nmodel: {hidden: 64, heads: 4, "
                                                   "ffn_hidden: 96, layers: 3, seq_len: 16}", "t"), 1);
  auto info = hp::model_info(s.config);
  EXPECT_EQ(info.name, "gpt");
  EXPECT_TRUE(info.uses("attention.heads"));
  EXPECT_EQ(info.size("heads")->value, 4);
  EXPECT_EQ(info.size("ffn")->value, 96);
  EXPECT_EQ(info.size("sequence")->value, 16);
  EXPECT_EQ(info.size("blocks")->value, 5);
  EXPECT_EQ(info.block_flops.size(), 5u) << "embed, 3 blocks, head";
  EXPECT_EQ(info.inputs, std::vector<std::string>{"tokens"});
  auto unet = hp::prepare(hp::RawConfig::parse_string("data: {type: field}\nmodel: {type: unet}", "t"), 1);
  EXPECT_EQ(hp::model_info(unet.config).size("sequence"), nullptr) << "the unet cannot split its grid";
}

// Training FLOPs per token the standard way (6 N + 12 L h s for gpt), each
// model its own; a model that states none gets 3 x its declared forward costs.
TEST(ModelRegistry, TrainingFlopsPerTokenTheStandardWay) {
  const std::string dims = "model: {hidden: 64, heads: 4, ffn_hidden: 96, layers: 3, seq_len: 16, vocab_size: 256";
  auto gpt = hp::prepare(hp::RawConfig::parse_string("data: {type: synthetic}\n" + dims + "}", "t"), 1);
  // N = 3 (4 h^2 + 2 h f) + V h = 3 (16384 + 12288) + 16384 = 102400.
  EXPECT_DOUBLE_EQ(hp::model_info(gpt.config).train_flops_per_token, 6.0 * 102400 + 12.0 * 3 * 64 * 16);
  auto mlp = hp::prepare(hp::RawConfig::parse_string("data: {type: synthetic}\n" + dims + ", type: mlp}", "t"), 1);
  EXPECT_DOUBLE_EQ(hp::model_info(mlp.config).train_flops_per_token, 6.0 * (3 * 12288 + 16384));
  // MoE: the router (E h) and the top_k experts a token visits, 2 h f each.
  auto moe = hp::prepare(
      hp::RawConfig::parse_string("data: {type: synthetic}\n" + dims + ", moe: {num_experts: 4, top_k: 2}}", "t"), 1);
  EXPECT_DOUBLE_EQ(hp::model_info(moe.config).train_flops_per_token,
                   6.0 * (3 * (16384 + 4 * 64 + 2 * 12288) + 16384) + 12.0 * 3 * 64 * 16);
  auto unet = hp::prepare(hp::RawConfig::parse_string("data: {type: field}\nmodel: {type: unet}", "t"), 1);
  const auto u = hp::model_info(unet.config);
  double forward = u.loss_flops;
  for (double f : u.block_flops) forward += f;
  EXPECT_GT(forward, 0.0);
  EXPECT_DOUBLE_EQ(u.train_flops_per_token, 3 * forward);
}

// A feature checks the sizes the model states, without knowing the model.
TEST(ModelRegistry, AFeatureChecksADeclaredSplitSizeOfAModelItDoesNotKnow) {
  register_odd_model();
  const auto err = config_errors(
      "model: {type: odd_heads}\ndata: {type: synthetic}\ntraining: {global_batch_size: 4, micro_batch_size: 2}\n"
      "features: {tensor_parallel: {enabled: true, size: 2}}\n",
      2);
  EXPECT_NE(err.find("config error: features.tensor_parallel.size = 2: the head count of odd_heads = 3 (model.type) "
                     "is not divisible by it (legal: a divisor of 3)"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("the width of odd_heads"), std::string::npos) << "12 is divisible by 2: " << err;
  EXPECT_EQ(config_errors("model: {type: odd_heads}\ndata: {type: synthetic}\ntraining: {global_batch_size: 3, "
                          "micro_batch_size: 1}\nfeatures: {tensor_parallel: {enabled: true, size: 3}}\n",
                          3),
            "");
}

TEST(ModelRegistry, GptAttentionOptionsAreChecked) {
  const std::string base = "data: {type: synthetic}\nmodel: {type: gpt, ";
  EXPECT_EQ(config_errors(base + "attention: block, attention_block: 7}\n"), "");
  const auto bad = config_errors(base + "attention: flash}\n");
  EXPECT_NE(bad.find("config error: model.attention = flash"), std::string::npos) << bad;
  EXPECT_NE(bad.find("eager"), std::string::npos) << bad;
  const auto zero = config_errors(base + "attention: block, attention_block: 0}\n");
  EXPECT_NE(zero.find("config error: model.attention_block = 0"), std::string::npos) << zero;
  EXPECT_EQ(config_errors(base + "attention: auto, attention_auto_seq: 64}\n"), "");
  const auto none = config_errors(base + "attention: auto, attention_auto_seq: 0}\n");
  EXPECT_NE(none.find("config error: model.attention_auto_seq = 0"), std::string::npos) << none;
}

TEST(DatasetRegistry, ModelInputsMustBeProduced) {
  EXPECT_NE(config_errors("model: {type: unet}\ndata: {type: synthetic}\n")
                .find("data.type = synthetic: model 'unet' reads input 'field', which this dataset does not produce "
                      "(legal: field)"),
            std::string::npos);
}

// A sample depends on (seed, split, step, index) only: the same whatever
// batch it is asked in, and different across any of them.
TEST(Dataset, SampleIsAPureFunctionOfSeedSplitStepAndIndex) {
  for (const char* type : {"synthetic", "text", "field"}) {
    std::string yaml = std::string("data: {type: ") + type + "}\nmodel: {seq_len: 8" +
                       (std::string(type) == "field" ? ", type: unet" : "") + "}\n";
    auto s = hp::prepare(hp::RawConfig::parse_string(yaml, "t"), 1);
    auto ds = hp::make_dataset(s.config);
    const std::string input = std::string(type) == "field" ? "field" : "tokens";
    auto batch = hp::make_batch(*ds, hp::Split::kTrain, 5, 10, 4, 8);
    auto alone = hp::make_batch(*ds, hp::Split::kTrain, 5, 12, 1, 8);
    EXPECT_TRUE(torch::equal(batch.inputs[input][2], alone.inputs[input][0])) << type;
    EXPECT_TRUE(torch::equal(batch.targets.begin()->value()[2], alone.targets.begin()->value()[0])) << type;
    auto again = hp::make_dataset(s.config);
    EXPECT_TRUE(torch::equal(hp::make_batch(*again, hp::Split::kTrain, 5, 10, 4, 8).inputs[input], batch.inputs[input]))
        << type << ": a new dataset object gives the same samples";
    EXPECT_FALSE(torch::equal(hp::make_batch(*ds, hp::Split::kTrain, 6, 12, 1, 8).inputs[input], alone.inputs[input]))
        << type << ": another step";
    EXPECT_FALSE(torch::equal(hp::make_batch(*ds, hp::Split::kValid, 5, 12, 1, 8).inputs[input], alone.inputs[input]))
        << type << ": another split";
    auto reseeded = hp::prepare(hp::RawConfig::parse_string(yaml + "run: {seed: 99}\n", "t"), 1);
    EXPECT_FALSE(torch::equal(hp::make_batch(*hp::make_dataset(reseeded.config), hp::Split::kTrain, 5, 12, 1, 8)
                                  .inputs[input],
                              alone.inputs[input]))
        << type << ": another seed";
  }
}

// A parameter starts as the same slice of the same full tensor whatever the
// split: pieces of every split reassemble into the unsplit value.
TEST(BuildContext, InitialValueIsTheSameSliceAtAnySplit) {
  const auto full = hp::initial_value(7, "blocks.0.mlp.fc1.weight", {10, 6}, hp::Init::normal(0.02));
  EXPECT_TRUE(torch::equal(full, hp::initial_value(7, "blocks.0.mlp.fc1.weight", {10, 6}, hp::Init::normal(0.02))));
  EXPECT_FALSE(torch::equal(full, hp::initial_value(8, "blocks.0.mlp.fc1.weight", {10, 6}, hp::Init::normal(0.02))));
  EXPECT_FALSE(torch::equal(full, hp::initial_value(7, "blocks.1.mlp.fc1.weight", {10, 6}, hp::Init::normal(0.02))));
  auto s = hp::prepare(hp::RawConfig::parse_string("data: {type: synthetic}\n", "t"), 1);
  for (int parts : {1, 2, 3, 4}) {
    for (int dim : {0, 1}) {
      std::vector<torch::Tensor> pieces;
      for (int i = 0; i < parts; ++i) {
        auto [off, len] = hp::split_range(full.size(dim), parts, i);
        hp::BuildContext ctx(s.config, one(), hp::LayerRegistry::dense(), 7);
        torch::nn::Module m;
        auto p = ctx.param_at(m, "blocks.0.mlp.fc1.weight", "w", {10, 6}, hp::Init::normal(0.02),
                              {{"tp", hp::dist::Placement::shard(dim)}}, {{parts, i}});
        EXPECT_EQ(ctx.params()[0].spec.box.offsets[static_cast<std::size_t>(dim)], off);
        EXPECT_EQ(ctx.params()[0].spec.box.lengths[static_cast<std::size_t>(dim)], len);
        pieces.push_back(p.detach());
      }
      EXPECT_TRUE(torch::equal(torch::cat(pieces, dim), full)) << parts << " parts along " << dim;
    }
  }
}

namespace {
/// Adds an auxiliary loss of 2 x the sum of its input.
class AuxBlock : public hp::Block {
 public:
  explicit AuxBlock(hp::BuildContext& ctx, const std::string& name = "aux.w") {
    w_ = ctx.param(*this, name, "w", {3}, hp::Init::ones());
  }
  hp::Activations forward(const hp::Activations& in) override {
    auto h = in["tokens"].to(torch::kFloat).unsqueeze(-1) * w_;
    hp::add_aux_loss("balance", 2.0 * h.sum());
    return hp::make_activations({{"h", h}});
  }
  torch::Tensor w_;
};
class SumLoss : public hp::LossBlock {
 public:
  hp::LossOutput forward(const hp::Activations& out, const hp::Activations& targets) override {
    return {out["h"].sum(), targets["labels"].numel()};
  }
};
}  // namespace

// The step adds a block's auxiliary loss to the main loss, scaled like it,
// and reports it on its own; outside a step it is ignored.
TEST(AuxiliaryLoss, AddedToTheLossScaledAndReportedSeparately) {
  auto s = hp::prepare(hp::RawConfig::parse_string("data: {type: synthetic}\n", "t"), 1);
  hp::ModelDescription desc;
  desc.blocks.push_back({"aux", {}, [](hp::BuildContext& c) { return std::make_shared<AuxBlock>(c); }});
  desc.loss = [](hp::BuildContext&) { return std::make_shared<SumLoss>(); };
  desc.aux_losses = {"balance"};
  hp::BuildContext ctx(s.config, one(), hp::LayerRegistry::dense(), 1);
  auto model = hp::build_model(desc, ctx);
  auto exec = hp::make_sequential_executor();
  hp::StepWork w;
  w.micro_batches = 2;
  w.loss_scale = 0.5;
  w.batch = [](std::int64_t mb) {
    auto t = torch::full({1, 2}, static_cast<std::int64_t>(mb + 1));
    return hp::Batch{hp::make_activations({{"tokens", t}}), hp::make_activations({{"labels", t}})};
  };
  auto rep = exec->run(model, w);
  // Micro-batch k: h = (k+1) * w over 2 tokens -> main sum 3 * 2 * (k+1), aux 2x that.
  EXPECT_DOUBLE_EQ(rep.loss_sum, 6.0 + 12.0);
  EXPECT_DOUBLE_EQ(rep.aux_sums.at("balance"), 36.0);
  // d/dw of 0.5 * (main + aux) = 0.5 * 3 * sum of tokens = 0.5 * 3 * (2 + 4) per element.
  EXPECT_TRUE(torch::allclose(model.params[0].tensor.grad(), torch::full({3}, 9.0)));
  hp::add_aux_loss("ignored", torch::ones({}));  // no collection open: nothing happens
}

// Block observers (zero's just-in-time waits) see every forward of every
// block, in order, with its index in model order, from inside the block's
// wrapper (a recomputed block's replay is seen again); each parameter knows
// the block that created it.
TEST(BlockObserver, SeesEveryForwardInsideTheWrapperAndParametersKnowTheirBlock) {
  auto s = hp::prepare(hp::RawConfig::parse_string("data: {type: synthetic}\n", "t"), 1);
  hp::ModelDescription desc;
  for (const char* name : {"a", "b", "c"}) {
    desc.blocks.push_back({name, {}, [name](hp::BuildContext& c) {
                             auto b = std::make_shared<AuxBlock>(c, std::string(name) + ".w");
                             return b;
                           }});
  }
  desc.loss = [](hp::BuildContext&) { return std::make_shared<SumLoss>(); };
  hp::ModelExtensions ext;
  std::vector<std::string> seen;
  ext.add_wrapper("block", "test", [&](const hp::ForwardFn& inner, const hp::Activations& in) {
    seen.push_back("wrap");
    (void)inner(in);
    return inner(in);  // a replay, as recompute's backward does
  });
  ext.add_block_observer("first", {[&](int i) { seen.push_back("first " + std::to_string(i)); },
                                   [&](int i, const hp::Activations& in, const hp::Activations& out) {
                                     seen.push_back("after " + std::to_string(i) + " " + in.keys()[0] + "->" +
                                                    out.keys()[0]);
                                   }});
  ext.add_block_observer("second", {[&](int i) { seen.push_back("second " + std::to_string(i)); }, nullptr});
  hp::BuildContext ctx(s.config, one(), hp::LayerRegistry::dense(), 1);
  ext.apply_to(ctx);
  auto model = hp::build_model(desc, ctx, {0, 2});  // a stage holding blocks 0 and 2
  ASSERT_EQ(model.params.size(), 2u);
  EXPECT_EQ(model.params[0].block, 0);
  EXPECT_EQ(model.params[1].block, 2);
  auto t = torch::full({1, 2}, 1);
  hp::Activations a = hp::make_activations({{"tokens", t}});
  a = model.blocks[0]->forward(a);
  EXPECT_EQ(seen, (std::vector<std::string>{"wrap", "first 0", "second 0", "after 0 tokens->h", "first 0", "second 0",
                                            "after 0 tokens->h"}));
  hp::BuildContext bare(s.config, one(), hp::LayerRegistry::dense(), 1);
  EXPECT_TRUE(bare.block_observers().empty());
  EXPECT_THROW(ext.add_wrapper("block", "other", nullptr), std::invalid_argument) << "wrappers keep one owner";
}

// A feature's offer for a kind gives way to a feature that replaces it, in
// either order; two replacements (or two offers) are refused naming both.
TEST(LayerRegistry, AnOfferGivesWayToAReplacementInEitherOrder) {
  hp::LayerFactory f = [](const hp::LayerSpec&, hp::BuildContext&) { return std::shared_ptr<hp::Layer>(); };
  auto a = hp::LayerRegistry::dense();
  a.offer("moe", "tensor_parallel", f);
  EXPECT_EQ(a.owner("moe"), "tensor_parallel");
  a.replace("moe", "expert_parallel", f);
  EXPECT_EQ(a.owner("moe"), "expert_parallel");
  auto b = hp::LayerRegistry::dense();
  b.replace("moe", "expert_parallel", f);
  b.offer("moe", "tensor_parallel", f);
  EXPECT_EQ(b.owner("moe"), "expert_parallel");
  try {
    b.replace("moe", "other", f);
    FAIL() << "a second replacement was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "layer kind 'moe' is replaced by both 'expert_parallel' and 'other'");
  }
  auto c = hp::LayerRegistry::dense();
  c.offer("moe", "tensor_parallel", f);
  EXPECT_THROW(c.offer("moe", "other", f), std::invalid_argument);
}
