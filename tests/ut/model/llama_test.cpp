// The llama building blocks against their published definitions, computed
// here element by element in double: rotary embeddings (rotate-half: feature
// i pairs with i + d/2, angle position x theta^(-2i/d)), grouped-query key/
// value heads (query head j reads key/value head j / group) and RMSNorm.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "hp/model/layers.h"

namespace {

double rel(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>() /
         b.abs().max().item<double>();
}

TEST(Llama, RotaryIsTheRotateHalfFormulaAtGlobalPositions) {
  torch::manual_seed(3);
  const std::int64_t B = 2, T = 5, h = 3, d = 8, half = d / 2;
  const double theta = 10000.0;
  auto x = torch::randn({B, T, h, d});
  // Positions of a rank holding pieces of a longer sequence (not 0..T-1).
  auto pos = torch::tensor(std::vector<std::int64_t>{0, 1, 7, 8, 30}, torch::kLong);
  auto got = hp::rotary(x, pos, theta);
  auto want = torch::empty({B, T, h, d}, torch::kDouble);
  auto xd = x.to(torch::kDouble);
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(pos[t].item<std::int64_t>()) * std::pow(theta, -2.0 * i / d);
      auto x1 = xd.select(1, t).select(-1, i), x2 = xd.select(1, t).select(-1, i + half);
      want.select(1, t).select(-1, i).copy_(x1 * std::cos(a) - x2 * std::sin(a));
      want.select(1, t).select(-1, i + half).copy_(x2 * std::cos(a) + x1 * std::sin(a));
    }
  }
  EXPECT_LT(rel(got, want), 1e-5);
  // Position 0 is the identity; a rotation keeps each pair's length.
  EXPECT_TRUE(torch::equal(got.select(1, 0), x.select(1, 0)));
  EXPECT_LT(rel(got.pow(2).sum(-1), x.pow(2).sum(-1)), 1e-5);
}

TEST(Llama, RotaryScoresDependOnlyOnTheDistance) {
  torch::manual_seed(4);
  auto q = torch::randn({1, 1, 1, 16}), k = torch::randn({1, 1, 1, 16});
  auto at = [&](std::int64_t p) { return torch::tensor(std::vector<std::int64_t>{p}, torch::kLong); };
  auto score = [&](std::int64_t pq, std::int64_t pk) {
    return (hp::rotary(q, at(pq), 10000.0) * hp::rotary(k, at(pk), 10000.0)).sum().item<double>();
  };
  EXPECT_NEAR(score(5, 2), score(105, 102), 1e-4);
  EXPECT_GT(std::abs(score(5, 2) - score(5, 4)), 1e-3);  // and on the distance it does
}

TEST(Llama, GroupedKeyValueHeadsServeTheirQueryGroups) {
  auto kv = torch::randn({2, 3, 2, 4}).requires_grad_(true);
  auto r = hp::repeat_kv(kv, 6);
  ASSERT_EQ(r.sizes(), (std::vector<std::int64_t>{2, 3, 6, 4}));
  for (std::int64_t j = 0; j < 6; ++j) EXPECT_TRUE(torch::equal(r.select(2, j), kv.select(2, j / 3)));
  r.sum().backward();
  EXPECT_TRUE(torch::equal(kv.grad(), torch::full_like(kv, 3.0)));  // a shared head sums its group's gradients
  EXPECT_TRUE(hp::repeat_kv(kv, 2).is_same(kv));
  EXPECT_THROW(hp::repeat_kv(kv, 5), std::invalid_argument);
}

TEST(Llama, RmsNormIsTheFormula) {
  torch::manual_seed(5);
  auto x = torch::randn({3, 7, 16}), w = torch::randn({16});
  auto xd = x.to(torch::kDouble);
  auto want = xd / torch::sqrt(xd.pow(2).mean(-1, true) + 1e-6) * w.to(torch::kDouble);
  EXPECT_LT(rel(hp::rms_norm(x, w, 1e-6), want), 1e-6);
  // bf16 in, bf16 out, statistics in fp32.
  auto y = hp::rms_norm(x.to(torch::kBFloat16), w, 1e-6);
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  EXPECT_LT(rel(y, want), 1e-2);
}

}  // namespace
