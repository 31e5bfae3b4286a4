// Mixture of experts: the router (top-k, ties, score functions,
// renormalisation, a bias for selection only), the capacity rule, the
// auxiliary losses against hand-computed values, and the expert-parallel
// dispatch (the real plugin) against the dense layer on Gloo ranks, with
// uneven counts, a rank that receives nothing and every token on one expert.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "backends/dist/context.h"
#include "framework/config/config.h"
#include "framework/model/build_context.h"
#include "framework/model/extensions.h"
#include "framework/model/moe.h"
#include "framework/optim/grad_sync.h"
#include "framework/plugin/feature_runtime.h"
#include "framework/runtime/setup.h"
#include "tests/support/multi_rank.h"

namespace {

hp::MoeOptions opts(std::int64_t E, std::int64_t k) {
  hp::MoeOptions o;
  o.num_experts = E;
  o.top_k = k;
  return o;
}

}  // namespace

TEST(Router, TopKBreaksTiesToTheLowerExpertAndListsExpertsAscending) {
  // Token 0: all equal -> experts 0, 1. Token 1: 3 > 1 = 2 -> 3 then the lower of the tie, 1.
  auto logits = torch::tensor({{0.f, 0.f, 0.f, 0.f}, {0.f, 1.f, 1.f, 3.f}});
  auto r = hp::route(logits, {}, opts(4, 2), 2);
  EXPECT_TRUE(torch::equal(r.experts, torch::tensor({{0, 1}, {1, 3}})));
  auto p = torch::softmax(logits, -1);
  auto expect1 = torch::stack({p[1][1], p[1][3]}) / (p[1][1] + p[1][3]);
  EXPECT_TRUE(torch::allclose(r.weights[1], expect1));
  EXPECT_TRUE(torch::allclose(r.weights[0], torch::tensor({0.5f, 0.5f})));
  EXPECT_TRUE(r.kept.all().item<bool>());
}

TEST(Router, SigmoidScoresAndNoRenormalisation) {
  auto o = opts(3, 1);
  o.sigmoid = true;
  o.renormalize = false;
  auto logits = torch::tensor({{-1.f, 2.f, 0.5f}});
  auto r = hp::route(logits, {}, o, 1);
  EXPECT_EQ(r.experts.item<std::int64_t>(), 1);
  EXPECT_NEAR(r.weights.item<float>(), 1.f / (1.f + std::exp(-2.f)), 1e-6);
}

TEST(Router, TheBiasChoosesButTheWeightsComeFromTheProbabilities) {
  auto logits = torch::tensor({{2.f, 1.f, 0.f}});
  auto o = opts(3, 1);
  o.renormalize = false;
  auto r = hp::route(logits, torch::tensor({0.f, 0.f, 1.f}), o, 1);
  EXPECT_EQ(r.experts.item<std::int64_t>(), 2) << "p = (0.665, 0.245, 0.090) + bias (0, 0, 1)";
  EXPECT_NEAR(r.weights.item<float>(), torch::softmax(logits, -1)[0][2].item<float>(), 1e-7);
}

// Capacity per sequence: C = ceil(c k T / E); an expert keeps its C
// assignments of highest probability, ties to the earlier token.
TEST(Router, CapacityKeepsTheMostProbableAndTheEarlierOnTies) {
  auto o = opts(2, 1);
  o.capacity_factor = 1.0;  // C = ceil(1 * 1 * 4 / 2) = 2 per sequence
  EXPECT_EQ(o.capacity(4), 2);
  // Sequence of 4 tokens all choosing expert 0 with probabilities rising, then one tie.
  auto logits = torch::tensor({{1.f, 0.f}, {3.f, 0.f}, {2.f, 0.f}, {3.f, 0.f}});
  auto r = hp::route(logits, {}, o, 4);
  EXPECT_TRUE(torch::equal(r.kept.reshape({-1}), torch::tensor({false, true, false, true})));
  EXPECT_EQ(r.weights[0].item<float>(), 0.f) << "a dropped assignment weighs 0";
  // Two sequences of 2: each keeps its own C = 1.
  auto r2 = hp::route(logits, {}, [&] { auto p = o; p.capacity_factor = 1.0; return p; }(), 2);
  EXPECT_TRUE(torch::equal(r2.kept.reshape({-1}), torch::tensor({false, true, false, true})));
}

TEST(AuxLosses, LoadBalanceAndZLossAgainstHandComputedValues) {
  auto o = opts(2, 1);
  o.aux_loss_coef = 0.1;
  o.z_loss_coef = 0.01;
  auto logits = torch::tensor({{1.f, 0.f}, {0.f, 1.f}, {2.f, 0.f}});  // one sequence of 3
  auto r = hp::route(logits, {}, o, 3);
  auto p = torch::softmax(logits, -1);
  // f = (2/3, 1/3): tokens 0 and 2 choose expert 0; P = mean of p over tokens.
  const double P0 = p.select(1, 0).mean().item<double>(), P1 = p.select(1, 1).mean().item<double>();
  const double per_seq = 0.1 * 2 * (2.0 / 3 * P0 + 1.0 / 3 * P1);
  EXPECT_NEAR(hp::load_balance_loss_sum(r, o, 3).item<double>(), per_seq * 3, 1e-6) << "times the sequence length";
  const double z = 0.01 * torch::logsumexp(logits, -1).pow(2).sum().item<double>();
  EXPECT_NEAR(hp::z_loss_sum(r, o).item<double>(), z, 1e-6);
}

// ---- expert parallel against dense ------------------------------------------

namespace {

const hp::Setup& ep_setup(int ep) {
  static std::map<int, hp::Setup> cache;
  if (!cache.count(ep)) {
    cache[ep] = hp::prepare(hp::RawConfig::parse_string(
                                "data: {type: synthetic}\nmodel: {moe: {num_experts: 4, top_k: 2}}\n"
                                "training: {global_batch_size: " + std::to_string(4 * ep) +
                                    ", micro_batch_size: 1}\nfeatures: {expert_parallel: {enabled: true, size: " +
                                    std::to_string(ep) + "}}\n",
                                "t"),
                            ep);
  }
  return cache[ep];
}

/// How the router is set before the forward: random, every token to
/// experts 0 and 1 (rank 1 of ep=2 gets nothing), or all to expert 0 (k=1).
enum class Steer { kRandom, kFirstTwo, kOne };

hp::LayerSpec spec(std::int64_t k) {
  auto o = std::make_shared<hp::MoeOptions>(opts(4, k));
  hp::LayerSpec s{"moe", "m", 8, 12};
  s.moe = o;
  return s;
}

void steer(const std::vector<hp::ParamEntry>& params, Steer how) {
  if (how == Steer::kRandom) return;
  torch::NoGradGuard g;
  for (const auto& p : params) {
    if (p.spec.name != "m.router.weight") continue;
    auto w = p.tensor;
    w.fill_(-1.0);
    w[0].fill_(0.0);
    if (how == Steer::kFirstTwo) w[1].fill_(0.0);
  }
}

void ep_against_dense(int ep, std::int64_t k, Steer how) {
  const auto& setup = ep_setup(ep);
  const std::int64_t S = 2, T = 4, H = 8;  // per rank: 2 sequences of 4 tokens
  auto x_all = torch::randn({S * ep, T, H}, torch::make_generator<at::CPUGeneratorImpl>(5));
  if (how != Steer::kRandom) x_all = x_all.abs();
  auto w_out = torch::randn({S * ep, T, H}, torch::make_generator<at::CPUGeneratorImpl>(6));
  static auto one = hp::dist::DistributedContext::single();
  hp::BuildContext dctx(setup.config, *one, hp::LayerRegistry::dense(), 3);
  auto dense = hp::LayerRegistry::dense().make(spec(k), dctx);
  steer(dctx.params(), how);
  auto x_dense = x_all.clone().requires_grad_(true);
  (dense->forward(x_dense) * w_out).sum().backward();
  auto dense_out = dense->forward(x_all).detach();
  hp::test::run_ranks(hp::dist::ProcessMesh(1, ep, 1, ep), [&](hp::dist::DistributedContext& d) {
    hp::FeatureRuntime rt(setup.config, d);
    rt.install(setup.features);
    ASSERT_EQ(rt.model().layers().owner("moe"), "expert_parallel");
    hp::BuildContext ctx(setup.config, d, rt.model().layers(), 3);
    auto layer = rt.model().layers().make(spec(k), ctx);
    steer(ctx.params(), how);
    const int r = d.group("ep").rank();
    auto x = x_all.narrow(0, r * S, S).clone().requires_grad_(true);
    auto out = layer->forward(x);
    EXPECT_TRUE(torch::allclose(out, dense_out.narrow(0, r * S, S), 1e-5, 1e-6)) << "forward on rank " << r;
    (out * w_out.narrow(0, r * S, S)).sum().backward();
    EXPECT_TRUE(torch::allclose(x.grad(), x_dense.grad().narrow(0, r * S, S), 1e-5, 1e-6)) << "input gradient";
    hp::make_bucketed_reducer({1 << 20}, ctx.params(), d)->reduce();
    for (std::size_t i = 0; i < ctx.params().size(); ++i) {
      const auto& p = ctx.params()[i];
      auto full = dctx.params()[i].tensor.grad();
      auto expect = p.spec.sharded() ? full.narrow(p.spec.split_dim, p.spec.offset, p.spec.length) : full;
      EXPECT_TRUE(torch::allclose(p.tensor.grad(), expect, 1e-5, 1e-6)) << p.spec.name << " on rank " << r;
    }
  });
}

}  // namespace

TEST(ExpertParallel, MatchesDenseAtEp2) { ep_against_dense(2, 2, Steer::kRandom); }
TEST(ExpertParallel, MatchesDenseAtEp4) { ep_against_dense(4, 2, Steer::kRandom); }
TEST(ExpertParallel, ARankThatReceivesNoTokensWorks) { ep_against_dense(2, 2, Steer::kFirstTwo); }
TEST(ExpertParallel, EveryTokenOnOneExpertWorks) { ep_against_dense(4, 1, Steer::kOne); }
