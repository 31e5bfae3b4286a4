// Weight-decay groups: the default rule (no decay on one-dimensional
// parameters and embeddings; `all` the old behaviour), named groups by
// pattern (first match wins, weight decay and lr scale), the config's
// refusals, the optimizer applying them, and the dry run's table built
// from the model description without tensors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "framework/runtime/setup.h"
#include "framework/trainer/param_groups_report.h"
#include "hp/config/config.h"
#include "hp/config/errors.h"
#include "hp/optim/optimizer.h"
#include "hp/optim/param_groups.h"

namespace {

const char* kBase = R"(
model: {type: llama, layers: 2, hidden: 64, heads: 4, kv_heads: 2, ffn_hidden: 96, seq_len: 32, vocab_size: 64, qk_norm: true}
data: {type: synthetic}
training: {max_steps: 20, global_batch_size: 8, micro_batch_size: 2}
optimizer: {lr: 0.002, weight_decay: 0.1}
)";

hp::Config resolved(const std::vector<std::string>& overrides) {
  auto raw = hp::RawConfig::parse_string(kBase, "test.yaml");
  for (const auto& o : overrides) raw.apply_override(o);
  return hp::prepare(raw, 1).config;
}

/// The refusal of `overrides` ("" when accepted).
std::string refusal(const std::vector<std::string>& overrides) {
  try {
    resolved(overrides);
    return "";
  } catch (const hp::ConfigException& e) {
    return e.what();
  }
}

TEST(ParamGroups, GlobMatchesAnyRunAndOneCharacter) {
  EXPECT_TRUE(hp::glob_match("*.ln*", "blocks.3.ln1.weight"));
  EXPECT_TRUE(hp::glob_match("embed*", "embed.tok.weight"));
  EXPECT_TRUE(hp::glob_match("blocks.?.attn.*", "blocks.7.attn.q.weight"));
  EXPECT_FALSE(hp::glob_match("blocks.?.attn.*", "blocks.12.attn.q.weight"));
  EXPECT_FALSE(hp::glob_match("*.bias", "blocks.0.attn.proj.weight"));
  EXPECT_TRUE(hp::glob_match("*", ""));
}

TEST(ParamGroups, DefaultRuleSparesVectorsAndEmbeddings) {
  hp::GroupPolicy p;
  p.weight_decay = 0.1;
  EXPECT_EQ(p.of("blocks.0.attn.q.weight", {64, 64}, false).weight_decay, 0.1);
  EXPECT_EQ(p.of("blocks.0.moe.experts.up.weight", {4, 32, 64}, false).group, "decay");
  EXPECT_EQ(p.of("blocks.0.ln1.weight", {64}, false).weight_decay, 0.0);
  EXPECT_EQ(p.of("blocks.0.mlp.fc1.bias", {256}, false).group, "no_decay");
  EXPECT_EQ(p.of("embed.tok.weight", {64, 64}, true).weight_decay, 0.0);
  p.on = hp::DecayOn::kMatricesAndEmbeddings;
  EXPECT_EQ(p.of("embed.tok.weight", {64, 64}, true).weight_decay, 0.1);
  EXPECT_EQ(p.of("blocks.0.ln1.weight", {64}, false).weight_decay, 0.0);
  p.on = hp::DecayOn::kAll;
  EXPECT_EQ(p.of("blocks.0.ln1.weight", {64}, false).weight_decay, 0.1);
}

TEST(ParamGroups, NamedGroupsFirstMatchWins) {
  const auto c = resolved({R"(optimizer.groups=[{match: "*.ln*", weight_decay: 0.5, name: norms}, {match: "*", lr_scale: 0.1}])"});
  const auto p = hp::GroupPolicy::from(c);
  ASSERT_EQ(p.rules.size(), 2u);
  const auto norm = p.of("blocks.1.ln2.weight", {64}, false);
  EXPECT_EQ(norm.group, "norms");
  EXPECT_EQ(norm.weight_decay, 0.5);
  EXPECT_EQ(norm.lr_scale, 1.0);
  const auto q = p.of("blocks.1.attn.q.weight", {64, 64}, false);
  EXPECT_EQ(q.group, "groups[1]");
  EXPECT_EQ(q.weight_decay, 0.1);  // the default rule's decay, the group's lr scale
  EXPECT_EQ(q.lr_scale, 0.1);
  EXPECT_EQ(p.of("embed.tok.weight", {64, 64}, true).weight_decay, 0.0);
}

TEST(ParamGroups, BadGroupsAreRefusedNamingTheItem) {
  EXPECT_NE(refusal({R"(optimizer.groups=[{match: "*", weight_decay: -1}])"}).find("optimizer.groups"), std::string::npos);
  EXPECT_NE(refusal({R"(optimizer.groups=[{match: "*", lr: 2}])"}).find("unknown key 'lr'"), std::string::npos);
  EXPECT_NE(refusal({R"(optimizer.groups=[{weight_decay: 0}])"}).find("item 0 has no match pattern"), std::string::npos);
  EXPECT_NE(refusal({R"(optimizer.groups=[{match: "*"}])"}).find("sets neither weight_decay nor lr_scale"),
            std::string::npos);
  EXPECT_NE(refusal({"optimizer.groups=[abc]"}).find("item 0 is not a mapping"), std::string::npos);
  EXPECT_NE(refusal({"optimizer.weight_decay_on=some"}).find("optimizer.weight_decay_on"), std::string::npos);
  EXPECT_EQ(refusal({R"(optimizer.groups=[{match: "embed*", lr_scale: 0.1}])"}), "");
}

TEST(ParamGroups, TheOptimizerUsesEachParametersGroup) {
  // AdamW: decay multiplies the parameter by (1 - lr x scale x wd) before
  // the Adam step; with a zero gradient the Adam step is zero.
  hp::OptimizerOptions o;
  o.weight_decay = 0.1;
  auto table = std::make_shared<std::map<std::string, hp::ParamHyper>>();
  (*table)["a"] = {"decay", 0.1, 1.0};
  (*table)["b"] = {"no_decay", 0.0, 1.0};
  (*table)["c"] = {"slow", 0.1, 0.5};
  o.param_hypers = table;
  std::vector<hp::ParamEntry> params;
  for (const char* n : {"a", "b", "c"}) {
    hp::ParamEntry e;
    e.spec.name = n;
    e.spec.global_shape = {4};
    e.tensor = torch::ones({4});
    e.tensor.mutable_grad() = torch::zeros({4});
    params.push_back(e);
  }
  auto opt = hp::make_optimizer(o, params);
  opt->step(0.01);
  EXPECT_FLOAT_EQ(params[0].tensor[0].item<float>(), 1.0f - 0.01f * 0.1f);
  EXPECT_FLOAT_EQ(params[1].tensor[0].item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(params[2].tensor[0].item<float>(), 1.0f - 0.005f * 0.1f);
}

TEST(ParamGroups, TheDryRunTableComesFromTheDescription) {
  const std::string t = hp::describe_optimizer_groups(resolved({}));
  EXPECT_NE(t.find("optimizer groups (weight_decay 0.1 on matrices):"), std::string::npos) << t;
  // Per block: q, k, v, proj, gate, up, down decay; ln1, ln2, q_norm and k_norm do not.
  EXPECT_NE(t.find("decay (weight_decay 0.1, lr x1): 15 tensors"), std::string::npos) << t;
  EXPECT_NE(t.find("blocks.*.attn.q.weight x2"), std::string::npos) << t;
  EXPECT_NE(t.find("no_decay (weight_decay 0, lr x1): 10 tensors"), std::string::npos) << t;
  EXPECT_NE(t.find("embed.tok.weight"), std::string::npos) << t;
  EXPECT_NE(t.find("blocks.*.attn.k_norm.weight x2"), std::string::npos) << t;
}

}  // namespace
