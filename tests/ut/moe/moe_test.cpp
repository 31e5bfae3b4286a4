// Mixture of experts: the router (top-k, ties, score functions,
// renormalisation, a bias for selection only), the capacity rule, the
// auxiliary losses against hand-computed values, and the expert-parallel
// dispatch (the real plugin) against the dense layer on Gloo ranks, with
// uneven counts, a rank that receives nothing and every token on one expert.
#include "hp/model/moe.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include "hp/comm/context.h"
#include "hp/profile/trace.h"
#include "hp/config/config.h"
#include "hp/model/build_context.h"
#include "hp/model/extensions.h"
#include "framework/model/packed_gemm.h"
#include "hp/optim/grad_sync.h"
#include "hp/plugin/feature_runtime.h"
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
  auto r2 = hp::route(
      logits, {},
      [&] {
        auto p = o;
        p.capacity_factor = 1.0;
        return p;
      }(),
      2);
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
  EXPECT_NEAR(hp::load_balance_loss_sum(r, o, 3).item<double>(), per_seq * 3, 1e-6)
      << "times the sequence length";
  const double z = 0.01 * torch::logsumexp(logits, -1).pow(2).sum().item<double>();
  EXPECT_NEAR(hp::z_loss_sum(r, o).item<double>(), z, 1e-6);
}

// The device-level balance loss against values computed by hand: 4 experts
// in 2 groups, two sequences of 2 tokens, top-1; the gradient reaches the
// logits through the group probabilities only, and a balanced routing
// gives the coefficient itself per sequence.
TEST(AuxLosses, DeviceBalanceAgainstHandComputedValues) {
  auto o = opts(4, 1);
  o.aux_loss_coef = 0.0;
  o.device_balance_coef = 0.05;
  o.device_groups = 2;
  // Sequence 0: both tokens choose group 0 (experts 0 and 1); sequence 1:
  // one token each group (experts 1 and 3).
  auto logits = torch::tensor({{2.f, 0.f, 0.f, 1.f}, {0.f, 3.f, 1.f, 0.f},
                               {0.f, 2.f, 1.f, 0.f}, {0.f, 0.f, 1.f, 2.f}})
                    .requires_grad_(true);
  auto r = hp::route(logits, {}, o, 2);
  auto p = torch::softmax(logits.detach(), -1).to(torch::kDouble);
  auto group_p = [&](int t, int g) { return (p[t][2 * g] + p[t][2 * g + 1]).item<double>(); };
  // Per sequence: 0.05 x G x sum_g f'_g P'_g, P'_g the mean over its tokens.
  const double seq0 = 0.05 * 2 * (1.0 * (group_p(0, 0) + group_p(1, 0)) / 2 + 0.0);
  const double seq1 = 0.05 * 2 * (0.5 * (group_p(2, 0) + group_p(3, 0)) / 2 +
                                  0.5 * (group_p(2, 1) + group_p(3, 1)) / 2);
  auto loss = hp::device_balance_loss_sum(r, o, 2);
  EXPECT_NEAR(loss.item<double>(), (seq0 + seq1) * 2, 1e-6) << "times the sequence length";
  // Sequence 1 is balanced: its term is the coefficient whatever P' is.
  EXPECT_NEAR(seq1, 0.05, 1e-7);
  // d/dlogits: only through P' (f' is counted, no gradient); sequence 0
  // pushes probability out of group 0, sequence 1 (balanced) not at all.
  loss.backward();
  auto g = logits.grad();
  EXPECT_LT(g[0][2].item<double>(), 0.0) << "raising a group-1 expert's logit lowers the loss";
  EXPECT_GT(g[0][0].item<double>(), 0.0) << "raising a group-0 expert's logit raises it";
  EXPECT_NEAR(g[2].abs().sum().item<double>(), 0.0, 1e-7);
  EXPECT_NEAR(g[3].abs().sum().item<double>(), 0.0, 1e-7);
}

// ---- grouped expert compute against the per-expert loop ------------------------

namespace {

/// The per-expert loop the layer used before grouping (the reference): for
/// each expert in ascending order, its kept assignments found with nonzero,
/// its tokens gathered, its FFN run, the weighted outputs index_add-ed.
torch::Tensor per_expert_loop(const hp::ExpertWeights& w, std::int64_t first,
                              const torch::Tensor& tokens, const hp::Routing& r) {
  torch::Tensor out = torch::zeros_like(tokens);
  torch::Tensor flat_e = r.experts.reshape({-1}), flat_kept = r.kept.reshape({-1}),
                flat_w = r.weights.reshape({-1});
  const std::int64_t k = r.experts.size(1);
  for (std::int64_t j = 0; j < w.w1.size(0); ++j) {
    torch::Tensor slots = torch::nonzero(flat_e.eq(first + j).logical_and(flat_kept)).reshape({-1});
    if (slots.numel() == 0) continue;
    torch::Tensor tok = torch::div(slots, k, "floor");
    torch::Tensor y = w.forward(j, tokens.index_select(0, tok));
    out = out.index_add(0, tok, y * flat_w.index_select(0, slots).unsqueeze(1));
  }
  return out;
}

/// The capacity rule as the router computed it before (a host loop over
/// tokens): per sequence and expert, a stable sort by probability (desc).
torch::Tensor kept_by_host_loop(const hp::Routing& r, const hp::MoeOptions& o, std::int64_t seq) {
  const std::int64_t N = r.probs.size(0), E = o.num_experts, k = o.top_k, C = o.capacity(seq);
  auto ex = r.experts.accessor<std::int64_t, 2>();
  torch::Tensor probs = r.probs.detach();
  auto pp = probs.accessor<float, 2>();
  torch::Tensor kept = torch::ones({N, k}, torch::kBool);
  for (std::int64_t s0 = 0; s0 < N; s0 += seq) {
    std::vector<std::vector<std::pair<float, std::int64_t>>> by_expert(static_cast<std::size_t>(E));
    for (std::int64_t t = s0; t < s0 + seq; ++t) {
      for (std::int64_t j = 0; j < k; ++j)
        by_expert[static_cast<std::size_t>(ex[t][j])].emplace_back(pp[t][ex[t][j]], t * k + j);
    }
    for (auto& v : by_expert) {
      std::stable_sort(v.begin(), v.end(),
                       [](const auto& a, const auto& b) { return a.first > b.first; });
      for (std::size_t i = static_cast<std::size_t>(C); i < v.size(); ++i)
        kept.view({-1})[v[i].second] = false;
    }
  }
  return kept;
}

/// max |a - b| / max |b| (docs/PARITY.md).
double rel(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / (b.abs().max().item<double>() + 1e-12);
}

enum class Routes { kRandom, kOneExpertEmpty, kAllOnOne, kDrops, kTies };

struct Case {
  hp::MoeOptions o;
  torch::Tensor logits;
  std::int64_t seq = 0;
};

Case make_case(Routes how, std::uint64_t seed) {
  auto gen = torch::make_generator<at::CPUGeneratorImpl>(seed);
  const std::int64_t E = 6, S = 3, T = 20;
  Case c{opts(E, how == Routes::kAllOnOne ? 1 : 2), torch::randn({S * T, E}, gen), T};
  if (how == Routes::kOneExpertEmpty) c.logits.select(1, 4).fill_(-30.f);  // expert 4 gets nothing
  if (how == Routes::kAllOnOne) c.logits.select(1, 2).add_(30.f);  // every token on expert 2
  if (how == Routes::kDrops) c.o.capacity_factor = 0.75;
  if (how ==
      Routes::kTies) {  // few distinct probabilities: capacity ties broken by the earlier token
    c.logits = torch::randint(0, 3, {S * T, E}, gen).to(torch::kFloat);
    c.o.capacity_factor = 1.0;
  }
  return c;
}

hp::ExpertWeights random_experts(std::int64_t n, std::int64_t H, std::int64_t F,
                                 std::uint64_t seed) {
  auto gen = torch::make_generator<at::CPUGeneratorImpl>(seed);
  hp::ExpertWeights w;
  w.w1 = (torch::randn({n, F, H}, gen) * 0.3).requires_grad_(true);
  w.b1 = (torch::randn({n, F}, gen) * 0.1).requires_grad_(true);
  w.w2 = (torch::randn({n, H, F}, gen) * 0.3).requires_grad_(true);
  w.b2 = (torch::randn({n, H}, gen) * 0.1).requires_grad_(true);
  return w;
}

/// The same experts, detached copies that take their own gradients.
hp::ExpertWeights copy_of(const hp::ExpertWeights& a) {
  hp::ExpertWeights b;
  b.w1 = a.w1.detach().clone().requires_grad_(true);
  b.b1 = a.b1.detach().clone().requires_grad_(true);
  b.w2 = a.w2.detach().clone().requires_grad_(true);
  b.b2 = a.b2.detach().clone().requires_grad_(true);
  return b;
}

/// The gradients of two grouped nodes' inputs side by side: rows, w1, b1, w2, b2.
const char* const kNodeGradNames[] = {"rows", "w1", "b1", "w2", "b2"};
std::vector<std::pair<torch::Tensor, torch::Tensor>> grad_pairs(const torch::Tensor& ra,
                                                                const torch::Tensor& rb,
                                                                const hp::ExpertWeights& a,
                                                                const hp::ExpertWeights& b) {
  return {{ra.grad(), rb.grad()},
          {a.w1.grad(), b.w1.grad()},
          {a.b1.grad(), b.b1.grad()},
          {a.w2.grad(), b.w2.grad()},
          {a.b2.grad(), b.b2.grad()}};
}

struct Result {
  torch::Tensor out;
  std::vector<torch::Tensor> grads;  // tokens, logits, w1, b1, w2, b2
};

/// Forward and backward of a dispatch on the case (k experts of E from `first`).
template <class Dispatch>
Result run_dispatch(const Case& c, std::int64_t first, std::int64_t count, Dispatch dispatch) {
  // Widths multiples of 16: kPacked runs packed_gemm (not its fallback).
  const std::int64_t H = 16, F = 32;
  auto tokens = torch::randn({c.logits.size(0), H}, torch::make_generator<at::CPUGeneratorImpl>(11))
                    .requires_grad_(true);
  auto logits = c.logits.clone().requires_grad_(true);
  hp::ExpertWeights w = random_experts(count, H, F, 12 + static_cast<std::uint64_t>(first));
  hp::Routing r = hp::route(logits, {}, c.o, c.seq);
  torch::Tensor out = dispatch(w, first, tokens, r);
  auto w_out = torch::randn(out.sizes(), torch::make_generator<at::CPUGeneratorImpl>(13));
  (out * w_out).sum().backward();
  return {out.detach(),
          {tokens.grad(), logits.grad(), w.w1.grad(), w.b1.grad(), w.w2.grad(), w.b2.grad()}};
}

const char* kGradNames[] = {"tokens", "logits", "w1", "b1", "w2", "b2"};

void grouped_against_loop(Routes how, std::int64_t first, std::int64_t count) {
  for (std::uint64_t seed : {1, 2, 3}) {
    Case c = make_case(how, seed);
    Result ref = run_dispatch(c, first, count, per_expert_loop);
    using hp::ExpertCompute;
    for (ExpertCompute how : {ExpertCompute::kSlices, ExpertCompute::kPacked, ExpertCompute::kPadded}) {
      const bool slices = how == ExpertCompute::kSlices;
      Result got = run_dispatch(c, first, count,
                                [&](const auto& w, std::int64_t f, const auto& t, const auto& r) {
                                  return hp::dispatch_locally(w, f, t, r, how);
                                });
      const std::string what = std::string(slices                           ? "slices"
                                            : how == ExpertCompute::kPacked ? "packed"
                                                                            : "padded") +
                               ", seed " + std::to_string(seed);
      if (slices) {
        // Same rows, same order, same matmul shapes, same summation order: bitwise.
        EXPECT_TRUE(torch::equal(got.out, ref.out))
            << "forward, " << what << ": rel " << rel(got.out, ref.out);
      } else {
        EXPECT_LE(rel(got.out, ref.out), 1e-6) << "forward, " << what;
      }
      for (std::size_t i = 0; i < ref.grads.size(); ++i) {
        ASSERT_TRUE(got.grads[i].defined()) << kGradNames[i] << ", " << what;
        EXPECT_LE(rel(got.grads[i], ref.grads[i]), 1e-6)
            << "gradient of " << kGradNames[i] << ", " << what;
        // Printed, not asserted: autograd does not promise the order in which a
        // token's gradient contributions are accumulated.
        if (slices && !torch::equal(got.grads[i], ref.grads[i])) {
          std::cout << "note: gradient of " << kGradNames[i] << " not bitwise, rel "
                    << rel(got.grads[i], ref.grads[i]) << " (" << what << ")\n";
        }
      }
    }
  }
}

}  // namespace

TEST(GroupedExperts, RandomRoutingMatchesThePerExpertLoop) {
  grouped_against_loop(Routes::kRandom, 0, 6);
}
TEST(GroupedExperts, AnExpertWithNoTokens) { grouped_against_loop(Routes::kOneExpertEmpty, 0, 6); }
TEST(GroupedExperts, EveryTokenOnOneExpert) { grouped_against_loop(Routes::kAllOnOne, 0, 6); }
TEST(GroupedExperts, CapacityDrops) { grouped_against_loop(Routes::kDrops, 0, 6); }
TEST(GroupedExperts, ASliceOfTheExpertsAsOnAnExpertParallelRank) {
  grouped_against_loop(Routes::kDrops, 2, 3);
  grouped_against_loop(Routes::kOneExpertEmpty, 3, 3);
}

// The grouped FFN is one autograd node writing its outputs and gradients in
// place; each product must be the one autograd computes for a linear chain on
// the expert's slice, so outputs and every gradient (rows, w1, b1, w2, b2)
// are bitwise equal, with empty experts, one-row experts and one expert
// holding every row. Two passes, as two micro-batches: the node adds its
// expert weight gradients into .grad itself (inside the products) and the
// chain's go through AccumulateGrad; the sums must be bitwise equal too, and
// the weights' AccumulateGrad post-hooks (which count gradients for the
// reductions) must still fire once per pass.
TEST(GroupedExperts, OneNodeIsBitwiseTheLinearChainOnEachSlice) {
  struct CountFires : torch::autograd::FunctionPostHook {
    explicit CountFires(int* n) : n_(n) {}
    torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                              const torch::autograd::variable_list&) override {
      ++*n_;
      return outputs;
    }
    int* n_;
  };
  const std::int64_t H = 32, F = 48, n = 5;
  const std::vector<std::vector<std::int64_t>> layouts = {
      {7, 0, 13, 1, 9}, {0, 0, 30, 0, 0}, {1, 1, 1, 1, 1}, {64, 3, 0, 17, 2}};
  for (std::size_t li = 0; li < layouts.size(); ++li) {
    const auto& counts = layouts[li];
    const std::int64_t M = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
    auto gen = torch::make_generator<at::CPUGeneratorImpl>(40 + li);
    auto rows0 = torch::randn({M, H}, gen);
    hp::ExpertWeights a = random_experts(n, H, F, 50 + li), b = copy_of(a);
    int fires_w1 = 0, fires_w2 = 0;
    auto acc_w1 = torch::autograd::impl::grad_accumulator(a.w1);
    auto acc_w2 = torch::autograd::impl::grad_accumulator(a.w2);
    acc_w1->add_post_hook(std::make_unique<CountFires>(&fires_w1));
    acc_w2->add_post_hook(std::make_unique<CountFires>(&fires_w2));
    auto ra = rows0.clone().requires_grad_(true), rb = rows0.clone().requires_grad_(true);
    const std::string what = "layout " + std::to_string(li);
    for (int pass = 1; pass <= 2; ++pass) {
      auto gy = torch::randn({M, H}, gen);
      torch::Tensor ya;
      if (pass == 1) {
        // The experts run on the intra-op threads: one thread gives the same bits.
        const int threads = at::get_num_threads();
        at::set_num_threads(1);
        torch::Tensor y1 = a.forward_grouped(rows0, counts, hp::ExpertCompute::kSlices);
        at::set_num_threads(std::max(2, threads));
        ya = a.forward_grouped(ra, counts, hp::ExpertCompute::kSlices);
        at::set_num_threads(threads);
        EXPECT_TRUE(torch::equal(y1.detach(), ya.detach())) << "1 thread against 2, " << what;
      } else {
        ya = a.forward_grouped(ra, counts, hp::ExpertCompute::kSlices);
      }
      // The reference: autograd over a linear chain per slice.
      const auto xs = rb.split_with_sizes(counts);
      const auto w1s = b.w1.unbind(0), b1s = b.b1.unbind(0), w2s = b.w2.unbind(0),
                 b2s = b.b2.unbind(0);
      std::vector<torch::Tensor> outs;
      for (std::size_t j = 0; j < counts.size(); ++j) {
        if (counts[j] == 0) continue;
        outs.push_back(at::linear(at::gelu(at::linear(xs[j], w1s[j], b1s[j])), w2s[j], b2s[j]));
      }
      torch::Tensor yb = torch::cat(outs);
      ASSERT_TRUE(torch::equal(ya, yb)) << "forward, " << what << ": rel " << rel(ya, yb);
      (ya * gy).sum().backward();
      (yb * gy).sum().backward();
      EXPECT_EQ(fires_w1, pass) << "w1's AccumulateGrad post-hook, pass " << pass << ", " << what;
      EXPECT_EQ(fires_w2, pass) << "w2's AccumulateGrad post-hook, pass " << pass << ", " << what;
      const auto pairs = grad_pairs(ra, rb, a, b);
      const char* const* names = kNodeGradNames;
      for (int i = 0; i < 5; ++i) {
        ASSERT_TRUE(pairs[i].first.defined()) << names[i] << ", " << what;
        EXPECT_TRUE(torch::equal(pairs[i].first, pairs[i].second))
            << "gradient of " << names[i] << " after pass " << pass << ", " << what << ": rel "
            << rel(pairs[i].first, pairs[i].second);
      }
    }
  }
}

// Under autograd::grad nothing accumulates into .grad: the node returns its
// weight gradients like any other node (and leaves .grad alone), equal to
// what backward accumulates.
TEST(GroupedExperts, AutogradGradReturnsTheWeightGradientsAndLeavesGradAlone) {
  const std::int64_t H = 16, F = 24;
  const std::vector<std::int64_t> counts = {5, 0, 9};
  auto gen = torch::make_generator<at::CPUGeneratorImpl>(71);
  auto rows = torch::randn({14, H}, gen).requires_grad_(true);
  auto gy = torch::randn({14, H}, gen);
  hp::ExpertWeights w = random_experts(3, H, F, 72);
  auto grads = torch::autograd::grad({(w.forward_grouped(rows, counts, hp::ExpertCompute::kSlices) * gy).sum()},
                                     {w.w1, w.w2, rows});
  EXPECT_FALSE(w.w1.grad().defined()) << "autograd::grad wrote into w1.grad";
  EXPECT_FALSE(w.w2.grad().defined()) << "autograd::grad wrote into w2.grad";
  ASSERT_TRUE(grads[0].defined() && grads[1].defined()) << "weight gradients returned";
  (w.forward_grouped(rows, counts, hp::ExpertCompute::kSlices) * gy).sum().backward();
  EXPECT_TRUE(torch::equal(grads[0], w.w1.grad()));
  EXPECT_TRUE(torch::equal(grads[1], w.w2.grad()));
  EXPECT_TRUE(grads[1].select(0, 1).eq(0).all().item<bool>())
      << "the empty expert's gradient is zero";
}

// ---- packed expert weights (model.moe.expert_compute: packed) ----------------

// The packed small-row product against LibTorch's matmul (BLAS): row counts
// around the kernel's six-row blocks, reductions below, at and above its
// 256-long k blocks, with and without bias, operands inside wider rows
// (strides), B given transposed (the forward's W^T) and as it is (the
// backward's W).
TEST(PackedGemm, MatchesMatmulAcrossShapes) {
  if (!hp::packed_gemm::supported()) GTEST_SKIP() << "this CPU lacks AVX2 or FMA";
  auto gen = torch::make_generator<at::CPUGeneratorImpl>(81);
  for (std::int64_t m : {0, 1, 5, 6, 7, 13, 64, 100}) {
    for (std::int64_t K : {16, 255, 256, 300, 1024}) {
      for (std::int64_t N : {16, 48}) {
        for (bool transposed : {false, true}) {
          for (bool with_bias : {false, true}) {
            const std::string what = "m " + std::to_string(m) + ", K " + std::to_string(K) + ", N " +
                                     std::to_string(N) + (transposed ? ", W^T" : ", W") +
                                     (with_bias ? ", bias" : "");
            // x inside rows of K + 3, out inside rows of N + 5.
            torch::Tensor xw = torch::randn({m, K + 3}, gen), x = xw.narrow(1, 1, K);
            torch::Tensor w = transposed ? torch::randn({N, K}, gen) : torch::randn({K, N}, gen);
            torch::Tensor b = torch::randn({N}, gen);
            torch::Tensor B = transposed ? w.t() : w;  // [K, N]
            std::vector<float> panels(static_cast<std::size_t>(hp::packed_gemm::packed_size(K, N)));
            hp::packed_gemm::pack(w.data_ptr<float>(), K, N, transposed ? 1 : N, transposed ? K : 1,
                                  panels.data());
            torch::Tensor ow = torch::full({m, N + 5}, 7.0f), out = ow.narrow(1, 2, N);
            hp::packed_gemm::product(m, K, N, x.data_ptr<float>(), K + 3, panels.data(),
                                     with_bias ? b.data_ptr<float>() : nullptr, out.data_ptr<float>(),
                                     N + 5);
            // The exact product (in double) as the reference.
            torch::Tensor ref = x.to(torch::kDouble).matmul(B.to(torch::kDouble));
            if (with_bias) ref = ref + b.to(torch::kDouble);
            if (m > 0) {
              EXPECT_LE(rel(out.to(torch::kDouble), ref), 1e-6) << what;
            }
            EXPECT_TRUE(ow.narrow(1, 0, 2).eq(7.0f).all().item<bool>()) << "wrote left of out, " << what;
            EXPECT_TRUE(ow.narrow(1, N + 2, 3).eq(7.0f).all().item<bool>()) << "wrote right of out, " << what;
          }
        }
      }
    }
  }
}

// The AVX-512 kernel gives the AVX2 kernel's bits (each output element the
// same chain of FMAs): row counts around both kernels' blocks (6 and 8
// rows), one, two and three 16-wide panels (the AVX-512 kernel takes them
// two at a time), reductions below, at and above the 256-long k blocks,
// with and without bias, inside wider rows.
TEST(PackedGemm, Avx512KernelGivesTheAvx2Bits) {
  if (!hp::packed_gemm::supports_avx512()) GTEST_SKIP() << "this CPU lacks AVX-512F";
  auto gen = torch::make_generator<at::CPUGeneratorImpl>(85);
  for (std::int64_t m : {1, 5, 7, 8, 9, 13, 16, 100, 130}) {
    for (std::int64_t K : {16, 255, 256, 300, 1024}) {
      for (std::int64_t N : {16, 32, 48, 1024}) {
        for (bool with_bias : {false, true}) {
          const std::string what = "m " + std::to_string(m) + ", K " + std::to_string(K) + ", N " +
                                   std::to_string(N) + (with_bias ? ", bias" : "");
          torch::Tensor xw = torch::randn({m, K + 3}, gen), x = xw.narrow(1, 1, K);
          torch::Tensor w = torch::randn({N, K}, gen), b = torch::randn({N}, gen);
          std::vector<float> panels(static_cast<std::size_t>(hp::packed_gemm::packed_size(K, N)));
          hp::packed_gemm::pack(w.data_ptr<float>(), K, N, 1, K, panels.data());
          torch::Tensor o2 = torch::full({m, N + 5}, 7.0f), o5 = o2.clone();
          for (auto [out, kernel] : {std::pair{o2, hp::packed_gemm::Kernel::kAvx2},
                                     std::pair{o5, hp::packed_gemm::Kernel::kAvx512}})
            hp::packed_gemm::product(m, K, N, x.data_ptr<float>(), K + 3, panels.data(),
                                     with_bias ? b.data_ptr<float>() : nullptr,
                                     out.narrow(1, 2, N).data_ptr<float>(), N + 5, kernel);
          EXPECT_TRUE(torch::equal(o2, o5)) << what;
          // Not vacuous: the product was written (the reference in double).
          torch::Tensor ref = x.to(torch::kDouble).matmul(w.to(torch::kDouble).t());
          if (with_bias) ref = ref + b.to(torch::kDouble);
          EXPECT_LE(rel(o5.narrow(1, 2, N).to(torch::kDouble), ref), 1e-6) << what;
        }
      }
    }
  }
}

// The weight gradients' product a^T b (a [m, R] read transposed, b [m, C]
// packed) added to what out holds, on both kernels: against double, and
// the two kernels' bits the same. Reductions (m, the expert's rows) below,
// at and above the 256-long k blocks; R around both kernels' row blocks.
TEST(PackedGemm, TransposedProductAddsToOut) {
  if (!hp::packed_gemm::supported()) GTEST_SKIP() << "this CPU lacks AVX2 or FMA";
  auto gen = torch::make_generator<at::CPUGeneratorImpl>(87);
  std::vector<hp::packed_gemm::Kernel> kernels{hp::packed_gemm::Kernel::kAvx2};
  if (hp::packed_gemm::supports_avx512()) kernels.push_back(hp::packed_gemm::Kernel::kAvx512);
  for (std::int64_t m : {1, 7, 64, 256, 300}) {
    for (std::int64_t R : {5, 8, 13, 256}) {
      for (std::int64_t C : {16, 48, 1024}) {
        const std::string what = "m " + std::to_string(m) + ", R " + std::to_string(R) + ", C " + std::to_string(C);
        torch::Tensor a = torch::randn({m, R}, gen), b = torch::randn({m, C}, gen);
        torch::Tensor start = torch::randn({R, C}, gen);
        std::vector<float> panels(static_cast<std::size_t>(hp::packed_gemm::packed_size(m, C)));
        hp::packed_gemm::pack(b.data_ptr<float>(), m, C, C, 1, panels.data());
        torch::Tensor ref = start.to(torch::kDouble) + a.to(torch::kDouble).t().matmul(b.to(torch::kDouble));
        std::vector<torch::Tensor> outs;
        for (auto kernel : kernels) {
          torch::Tensor out = start.clone();
          hp::packed_gemm::product_add(R, m, C, a.data_ptr<float>(), 1, R, panels.data(), out.data_ptr<float>(),
                                       C, kernel);
          EXPECT_LE(rel(out.to(torch::kDouble), ref), 1e-6) << what;
          outs.push_back(out);
        }
        if (outs.size() == 2) EXPECT_TRUE(torch::equal(outs[0], outs[1])) << "AVX2 against AVX-512, " << what;
      }
    }
  }
}

// Both operands of a weight packed in one pass (what the experts use) are
// the panels pack() gives each of them, bit for bit: W [R, C] as B = W and
// as B = W^T, at sides of one and of several 16-wide panels, square and
// not, and the expert shapes of the benchmarks (1024 x 256, 256 x 1024);
// and the panels multiply as pack()'s do.
TEST(PackedGemm, PackBothIsTwoPacks) {
  auto gen = torch::make_generator<at::CPUGeneratorImpl>(83);
  for (auto [R, C] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {16, 16}, {16, 48}, {48, 16}, {32, 320}, {1024, 256}, {256, 1024}}) {
    const std::string what = "R " + std::to_string(R) + ", C " + std::to_string(C);
    torch::Tensor w = torch::randn({R, C}, gen);
    const float* W = w.data_ptr<float>();
    std::vector<float> direct(static_cast<std::size_t>(R * C), -1.0f), transposed = direct;
    std::vector<float> one(direct.size()), other(direct.size());
    hp::packed_gemm::pack(W, R, C, C, 1, one.data());
    hp::packed_gemm::pack(W, C, R, 1, C, other.data());
    hp::packed_gemm::pack_both(W, R, C, direct.data(), transposed.data());
    EXPECT_EQ(direct, one) << "B = W, " << what;
    EXPECT_EQ(transposed, other) << "B = W^T, " << what;
    if (!hp::packed_gemm::supported()) continue;
    // x W (K = R) and x W^T (K = C) through the panels, against double.
    torch::Tensor x = torch::randn({7, R}, gen), y = torch::randn({7, C}, gen);
    torch::Tensor xw = torch::empty({7, C}), yw = torch::empty({7, R});
    hp::packed_gemm::product(7, R, C, x.data_ptr<float>(), R, direct.data(), nullptr, xw.data_ptr<float>(), C);
    hp::packed_gemm::product(7, C, R, y.data_ptr<float>(), C, transposed.data(), nullptr, yw.data_ptr<float>(), R);
    EXPECT_LE(rel(xw.to(torch::kDouble), x.to(torch::kDouble).matmul(w.to(torch::kDouble))), 1e-6) << what;
    EXPECT_LE(rel(yw.to(torch::kDouble), y.to(torch::kDouble).matmul(w.to(torch::kDouble).t())), 1e-6) << what;
  }
}

// The packed node against the BLAS one (kSlices) on the same grouped rows:
// output and every gradient within 1e-6 over two passes (the expert weight
// gradients accumulate into .grad), with empty experts, one-row experts,
// one expert holding every row, experts above a k block (F = 320) and an
// expert whose rows (the weight gradients' k) span two k blocks (300), an
// odd number of 16-wide panels (H = 48); and the same bits at one thread
// and at two, forward and every gradient.
TEST(GroupedExperts, PackedMatchesSlices) {
  if (!hp::packed_gemm::supported()) GTEST_SKIP() << "this CPU lacks AVX2 or FMA";
  const std::int64_t H = 48, F = 320, n = 5;
  const std::vector<std::vector<std::int64_t>> layouts = {
      {7, 0, 13, 1, 9}, {0, 0, 70, 0, 0}, {1, 1, 1, 1, 1}, {64, 3, 0, 17, 2}, {300, 0, 5, 0, 2}};
  for (std::size_t li = 0; li < layouts.size(); ++li) {
    const auto& counts = layouts[li];
    const std::int64_t M = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
    auto gen = torch::make_generator<at::CPUGeneratorImpl>(90 + li);
    auto rows0 = torch::randn({M, H}, gen);
    hp::ExpertWeights a = random_experts(n, H, F, 95 + li), b = copy_of(a);
    a.packs = hp::make_expert_packs();  // reused across the passes, as in training
    ASSERT_TRUE(hp::ExpertWeights::packable(rows0, a.w1, a.w2));
    hp::ExpertWeights one = copy_of(a);  // the packed node at one thread
    one.packs = hp::make_expert_packs();
    auto ra = rows0.clone().requires_grad_(true), rb = rows0.clone().requires_grad_(true);
    auto r1 = rows0.clone().requires_grad_(true);
    const std::string what = "layout " + std::to_string(li);
    for (int pass = 1; pass <= 2; ++pass) {
      auto gy = torch::randn({M, H}, gen);
      const int threads = at::get_num_threads();
      at::set_num_threads(1);
      torch::Tensor y1 = one.forward_grouped(r1, counts, hp::ExpertCompute::kPacked);
      (y1 * gy).sum().backward();
      at::set_num_threads(std::max(2, threads));
      torch::Tensor ya = a.forward_grouped(ra, counts, hp::ExpertCompute::kPacked);
      EXPECT_TRUE(torch::equal(y1.detach(), ya.detach())) << "1 thread against 2, " << what;
      torch::Tensor yb = b.forward_grouped(rb, counts, hp::ExpertCompute::kSlices);
      EXPECT_LE(rel(ya, yb), 1e-6) << "forward, pass " << pass << ", " << what;
      (ya * gy).sum().backward();
      at::set_num_threads(threads);
      (yb * gy).sum().backward();
      const auto pairs = grad_pairs(ra, rb, a, b);
      const auto same = grad_pairs(r1, ra, one, a);
      const char* const* names = kNodeGradNames;
      for (int i = 0; i < 5; ++i) {
        ASSERT_TRUE(pairs[i].first.defined()) << names[i] << ", " << what;
        EXPECT_LE(rel(pairs[i].first, pairs[i].second), 1e-6)
            << "gradient of " << names[i] << " after pass " << pass << ", " << what;
        EXPECT_TRUE(torch::equal(same[i].first, same[i].second))
            << "gradient of " << names[i] << ", 1 thread against 2, pass " << pass << ", " << what;
      }
    }
  }
}

// The experts' spans in a profile carry the rows the experts ran on (the
// rank's load, which bench/moe_rank_load.py reads), forward and backward,
// for both expert computes.
TEST(GroupedExperts, SpansCarryTheirRowCount) {
  const std::vector<std::int64_t> counts = {5, 0, 11, 2};
  const std::int64_t M = 18, H = 16, F = 32;
  for (auto compute : {hp::ExpertCompute::kSlices, hp::ExpertCompute::kPacked}) {
    if (compute == hp::ExpertCompute::kPacked && !hp::packed_gemm::supported()) continue;
    hp::ExpertWeights w = random_experts(4, H, F, 7);
    if (compute == hp::ExpertCompute::kPacked) w.packs = hp::make_expert_packs();
    auto rows = torch::randn({M, H}).requires_grad_(true);
    hp::profile::take_events();  // nothing from before
    hp::profile::set_recording(true);
    w.forward_grouped(rows, counts, compute).sum().backward();
    hp::profile::set_recording(false);
    std::map<std::string, double> seen;
    for (const auto& e : hp::profile::take_events())
      for (const auto& a : e.args)
        if (a.key == "rows" && a.is_number) seen[e.name] = a.number;
    EXPECT_EQ(seen["moe.experts"], M) << static_cast<int>(compute);
    EXPECT_EQ(seen["moe.experts.backward"], M) << static_cast<int>(compute);
  }
}

// A pack follows its weight: an in-place change (the version counter) is
// seen at the next product; a change that bypasses the counter (a write into
// the storage through another tensor, as ZeRO's gathers do) is not, until
// mark_stale, which the layer calls at every step end.
TEST(GroupedExperts, PacksFollowTheirWeights) {
  if (!hp::packed_gemm::supported()) GTEST_SKIP() << "this CPU lacks AVX2 or FMA";
  const std::int64_t H = 16, F = 32;
  const std::vector<std::int64_t> counts = {6, 0, 9};
  auto gen = torch::make_generator<at::CPUGeneratorImpl>(77);
  auto rows = torch::randn({15, H}, gen);
  hp::ExpertWeights w = random_experts(3, H, F, 78);
  w.packs = hp::make_expert_packs();
  hp::ExpertWeights fresh = w;
  fresh.packs = nullptr;  // packs afresh for each call
  auto run = [&](const hp::ExpertWeights& e) {
    torch::NoGradGuard g;
    return e.forward_grouped(rows, counts, hp::ExpertCompute::kPacked);
  };
  torch::Tensor before = run(w);
  {
    torch::NoGradGuard g;
    w.w1.mul_(0.5);  // bumps the version counter
  }
  torch::Tensor after = run(w);
  EXPECT_FALSE(torch::equal(before, after)) << "the product did not change with its weight";
  EXPECT_TRUE(torch::equal(after, run(fresh))) << "an in-place change was not packed again";
  // Through an alias on the same storage the counter stays put.
  torch::Tensor alias = torch::empty({0}).set_(w.w2.storage(), w.w2.storage_offset(), w.w2.sizes(),
                                                w.w2.strides());
  alias.mul_(2.0);
  EXPECT_TRUE(torch::equal(run(w), after)) << "the stale pack was not used: this test checks nothing";
  hp::mark_stale(*w.packs);
  torch::Tensor now = run(w);
  EXPECT_FALSE(torch::equal(now, after));
  EXPECT_TRUE(torch::equal(now, run(fresh))) << "mark_stale did not make the next product pack again";
}

TEST(GroupedExperts, GroupsAreByExpertThenToken) {
  Case c = make_case(Routes::kDrops, 4);
  hp::Routing r = hp::route(c.logits, {}, c.o, c.seq);
  hp::ExpertGroups g = hp::group_by_expert(r, 0, 6);
  auto e = r.experts.reshape({-1}).index_select(0, g.order);
  auto t = torch::div(g.order, 2, "floor");
  std::int64_t off = 0;
  for (std::int64_t j = 0; j < 6; ++j) {
    const std::int64_t n = g.counts[static_cast<std::size_t>(j)];
    EXPECT_TRUE(e.narrow(0, off, n).eq(j).all().item<bool>())
        << "expert " << j << "'s rows are one slice";
    if (n > 1)
      EXPECT_TRUE((t.narrow(0, off + 1, n - 1) > t.narrow(0, off, n - 1)).all().item<bool>())
          << "tokens ascend";
    off += n;
  }
  EXPECT_EQ(off, r.kept.sum().item<std::int64_t>()) << "every kept assignment once, no dropped one";
}

TEST(Router, CapacityWithTensorOpsEqualsTheHostLoop) {
  for (Routes how : {Routes::kDrops, Routes::kTies}) {
    for (std::uint64_t seed : {1, 2, 3, 4, 5}) {
      Case c = make_case(how, seed);
      for (std::int64_t seq : {c.seq, c.seq / 2, std::int64_t{1}}) {
        hp::Routing r = hp::route(c.logits, {}, c.o, seq);
        torch::Tensor expect = kept_by_host_loop(r, c.o, seq);
        EXPECT_TRUE(torch::equal(r.kept, expect)) << "seed " << seed << ", seq " << seq;
        if (seq == c.seq)
          EXPECT_LT(r.kept.sum().item<std::int64_t>(), r.kept.numel())
              << "the case drops something";
      }
    }
  }
}

// ---- expert parallel against dense ------------------------------------------

namespace {

const hp::Setup& ep_setup(int ep) {
  static std::map<int, hp::Setup> cache;
  if (!cache.count(ep)) {
    cache[ep] = hp::prepare(
        hp::RawConfig::parse_string(
            "data: {type: synthetic}\nmodel: {moe: {num_experts: 4, top_k: 2}}\n"
            "training: {global_batch_size: " +
                std::to_string(4 * ep) +
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
  hp::test::run_ranks(hp::test::grid(1, ep, 1, ep), [&](hp::dist::DistributedContext& d) {
    hp::FeatureRuntime rt(setup.config, d);
    rt.install(setup.features);
    ASSERT_EQ(rt.model().layers().owner("moe"), "expert_parallel");
    hp::BuildContext ctx(setup.config, d, rt.model().layers(), 3);
    auto layer = rt.model().layers().make(spec(k), ctx);
    steer(ctx.params(), how);
    const int r = d.group("ep").rank();
    auto x = x_all.narrow(0, r * S, S).clone().requires_grad_(true);
    auto out = layer->forward(x);
    EXPECT_TRUE(torch::allclose(out, dense_out.narrow(0, r * S, S), 1e-5, 1e-6))
        << "forward on rank " << r;
    (out * w_out.narrow(0, r * S, S)).sum().backward();
    EXPECT_TRUE(torch::allclose(x.grad(), x_dense.grad().narrow(0, r * S, S), 1e-5, 1e-6))
        << "input gradient";
    hp::make_bucketed_reducer({1 << 20}, ctx.params(), d)->reduce();
    for (std::size_t i = 0; i < ctx.params().size(); ++i) {
      const auto& p = ctx.params()[i];
      auto full = dctx.params()[i].tensor.grad();
      auto expect = p.spec.sharded() ? hp::dist::slice_of(full, p.spec.box) : full;
      EXPECT_TRUE(torch::allclose(p.tensor.grad(), expect, 1e-5, 1e-6))
          << p.spec.name << " on rank " << r;
    }
  });
}

}  // namespace

TEST(ExpertParallel, MatchesDenseAtEp2) { ep_against_dense(2, 2, Steer::kRandom); }
TEST(ExpertParallel, MatchesDenseAtEp4) { ep_against_dense(4, 2, Steer::kRandom); }
TEST(ExpertParallel, ARankThatReceivesNoTokensWorks) { ep_against_dense(2, 2, Steer::kFirstTwo); }
TEST(ExpertParallel, EveryTokenOnOneExpertWorks) { ep_against_dense(4, 1, Steer::kOne); }
