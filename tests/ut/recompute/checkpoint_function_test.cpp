// The recompute autograd function against plain autograd: same outputs,
// bitwise-equal gradients for inputs and parameters, and dropout replayed.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hp/model/block_attention.h"
#include "plugins/recompute/checkpoint_function.h"

namespace {
struct Net {
  torch::Tensor w1 = torch::randn({8, 8}).requires_grad_(true);
  torch::Tensor w2 = torch::randn({8, 8}).requires_grad_(true);
  hp::Activations operator()(const hp::Activations& in) const {
    auto h = torch::gelu(torch::matmul(in["x"], w1));
    h = torch::dropout(h, 0.3, /*train=*/true);
    return hp::make_activations({{"y", torch::matmul(h, w2)}, {"skip", in["x"] * 2}});
  }
};
}  // namespace

TEST(Recompute, GradientsAreBitwiseEqualWithDropout) {
  torch::manual_seed(0);
  Net net;
  auto x0 = torch::randn({4, 8});
  auto run = [&](bool recompute) {
    net.w1.mutable_grad() = torch::Tensor();
    net.w2.mutable_grad() = torch::Tensor();
    auto x = x0.clone().requires_grad_(true);
    torch::manual_seed(42);
    auto in = hp::make_activations({{"x", x}});
    auto out = recompute ? hp::recompute::checkpointed(std::cref(net), in) : net(in);
    (out["y"].sum() + out["skip"].pow(2).sum()).backward();
    return std::vector<torch::Tensor>{out["y"].detach(), x.grad(), net.w1.grad(), net.w2.grad()};
  };
  auto plain = run(false);
  auto again = run(true);
  ASSERT_TRUE(again[1].defined()) << "no gradient reached the input";
  ASSERT_TRUE(again[2].defined()) << "no gradient reached the parameters";
  for (std::size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(torch::equal(plain[i], again[i])) << "tensor " << i;
  }
}

TEST(Recompute, NoGradModeRunsThrough) {
  Net net;
  torch::NoGradGuard no_grad;
  auto out = hp::recompute::checkpointed(std::cref(net), hp::make_activations({{"x", torch::randn({2, 8})}}));
  EXPECT_FALSE(out["y"].requires_grad());
}

TEST(Recompute, ChainedBlocksPassGradientsThrough) {
  // Two recomputed blocks in a row after an embedding, as full recompute
  // wraps consecutive transformer blocks.
  torch::manual_seed(1);
  auto emb = torch::randn({10, 8}).requires_grad_(true);
  Net a, b;
  auto ids = torch::randint(0, 10, {4});
  auto run = [&](bool recompute) {
    for (auto* t : {&emb, &a.w1, &a.w2, &b.w1, &b.w2}) t->mutable_grad() = torch::Tensor();
    torch::manual_seed(5);
    auto h = hp::make_activations({{"x", torch::embedding(emb, ids)}});
    auto block = [&](const Net& n, const hp::Activations& in) {
      auto out = recompute ? hp::recompute::checkpointed(std::cref(n), in) : n(in);
      return hp::make_activations({{"x", out["y"]}});
    };
    auto out = block(b, block(a, h));
    out["x"].pow(2).sum().backward();
    return std::vector<torch::Tensor>{emb.grad(), a.w1.grad(), b.w2.grad()};
  };
  auto plain = run(false);
  auto again = run(true);
  for (std::size_t i = 0; i < plain.size(); ++i) {
    ASSERT_TRUE(again[i].defined()) << "tensor " << i;
    EXPECT_TRUE(torch::equal(plain[i], again[i])) << "tensor " << i;
  }
}

TEST(Recompute, BlockAttentionReplaysBitwise) {
  // Selective recompute wraps the attention core; with model.attention:
  // block that core is itself a custom autograd function.
  torch::manual_seed(3);
  auto qkv0 = torch::randn({2, 37, 2, 3, 8});
  auto run = [&](bool recompute) {
    auto qkv = qkv0.clone().requires_grad_(true);
    auto parts = qkv.unbind(3);
    hp::ForwardFn core = [](const hp::Activations& a) {
      return hp::make_activations({{"y", hp::block_causal_attention(a["q"], a["k"], a["v"], 16)}});
    };
    auto in = hp::make_activations({{"q", parts[0]}, {"k", parts[1]}, {"v", parts[2]}});
    auto out = recompute ? hp::recompute::checkpointed(core, in) : core(in);
    out["y"].pow(2).sum().backward();
    return std::vector<torch::Tensor>{out["y"].detach(), qkv.grad()};
  };
  auto plain = run(false);
  auto again = run(true);
  ASSERT_TRUE(again[1].defined()) << "no gradient reached q, k, v";
  for (std::size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::equal(plain[i], again[i])) << "tensor " << i;
}
