// Each tensor-parallel layer kind against its dense twin at T = 2 and 4:
// outputs and every gradient (the parallel gradient of each parameter must
// equal its slice of the dense gradient), including an uneven vocabulary.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "framework/config/config.h"
#include "framework/model/layers.h"
#include "framework/runtime/setup.h"
#include "plugins/tensor_parallel/layers.h"
#include "tests/support/multi_rank.h"

namespace {

struct Result {
  torch::Tensor out, input_grad;
  std::vector<hp::ParamEntry> params;
};

const hp::Config& config() {
  static hp::Setup s = hp::prepare(hp::RawConfig::parse_string("data: {type: synthetic}\nmodel: {vocab_size: 66}", "t"), 1);
  return s.config;
}

/// Builds `spec` with `registry`, runs it on `x` (ids for embeddings), and
/// back-propagates <out, w> for a fixed w.
Result run(const hp::LayerSpec& spec, const hp::LayerRegistry& registry, hp::dist::DistributedContext* d,
           const torch::Tensor& x) {
  hp::BuildContext ctx(config(), d, registry, 99);
  auto layer = registry.make(spec, ctx);
  auto in = x.is_floating_point() ? x.clone().requires_grad_(true) : x;
  auto out = layer->forward(in);
  auto w = torch::randn(out.sizes(), torch::make_generator<at::CPUGeneratorImpl>(7));
  (out * w).sum().backward();
  return {out.detach(), in.requires_grad() ? in.grad() : torch::Tensor(), ctx.params()};
}

void expect_same(const Result& dense, const Result& par) {
  EXPECT_TRUE(torch::allclose(par.out, dense.out, 1e-5, 1e-6)) << "forward";
  if (dense.input_grad.defined()) {
    EXPECT_TRUE(torch::allclose(par.input_grad, dense.input_grad, 1e-5, 1e-6)) << "input gradient";
  }
  ASSERT_EQ(par.params.size(), dense.params.size());
  for (std::size_t i = 0; i < par.params.size(); ++i) {
    const auto& p = par.params[i];
    auto full = dense.params[i].tensor.grad();
    auto expect = p.spec.sharded() ? full.narrow(p.spec.split_dim, p.spec.offset, p.spec.length) : full;
    EXPECT_TRUE(torch::allclose(p.tensor.grad(), expect, 1e-5, 1e-6)) << p.spec.name;
  }
}

void check_kind(int T, const hp::LayerSpec& spec, const torch::Tensor& x) {
  auto dense = run(spec, hp::LayerRegistry::dense(), nullptr, x);
  hp::test::run_ranks(hp::dist::ProcessMesh(1, 1, T), [&](hp::dist::DistributedContext& d) {
    auto registry = hp::LayerRegistry::dense();
    hp::tensor_parallel::replace_kinds(registry, "tensor_parallel");
    expect_same(dense, run(spec, registry, &d, x));
  });
}

class TensorParallelKinds : public ::testing::TestWithParam<int> {};
torch::Tensor act() { return torch::randn({2, 8, 16}, torch::make_generator<at::CPUGeneratorImpl>(3)); }

}  // namespace

TEST_P(TensorParallelKinds, ColumnLinearGathered) {
  check_kind(GetParam(), hp::LayerSpec{"linear.column", "c", 16, 24}, act());
}

TEST_P(TensorParallelKinds, RowLinearScattersItsInput) {
  check_kind(GetParam(), hp::LayerSpec{"linear.row", "r", 16, 12}, act());
}

TEST_P(TensorParallelKinds, VocabularyEmbeddingUnevenVocabulary) {
  auto ids = torch::randint(0, 66, {2, 8}, torch::make_generator<at::CPUGeneratorImpl>(5));
  check_kind(GetParam(), hp::LayerSpec{"embedding.vocab", "e", 66, 16}, ids);
}

TEST_P(TensorParallelKinds, HeadSplitAttention) {
  hp::LayerSpec s{"attention.heads", "a", 16, 16};
  s.heads = 4;
  check_kind(GetParam(), s, act());
}

TEST_P(TensorParallelKinds, ColumnThenRowMlp) {
  check_kind(GetParam(), hp::LayerSpec{"mlp", "m", 16, 32}, act());
}

TEST_P(TensorParallelKinds, VocabularyParallelCrossEntropyNeverGathersLogits) {
  const int T = GetParam();
  auto logits = torch::randn({2, 8, 66}, torch::make_generator<at::CPUGeneratorImpl>(11));
  auto targets = torch::randint(0, 66, {2, 8}, torch::make_generator<at::CPUGeneratorImpl>(12));
  hp::BuildContext dctx(config(), nullptr, hp::LayerRegistry::dense(), 1);
  auto dense_in = logits.clone().requires_grad_(true);
  auto dense = hp::LayerRegistry::dense().make_loss({"loss.cross_entropy", "loss"}, dctx)->forward(dense_in, targets);
  dense.sum.backward();
  hp::test::run_ranks(hp::dist::ProcessMesh(1, 1, T), [&](hp::dist::DistributedContext& d) {
    auto registry = hp::LayerRegistry::dense();
    hp::tensor_parallel::replace_kinds(registry, "tensor_parallel");
    hp::BuildContext ctx(config(), &d, registry, 1);
    auto [off, len] = hp::split_range(66, T, d.group("tp").rank());
    auto local = logits.narrow(-1, off, len).clone().requires_grad_(true);
    auto out = registry.make_loss({"loss.cross_entropy", "loss"}, ctx)->forward(local, targets);
    EXPECT_NEAR(out.sum.item<double>(), dense.sum.item<double>(), 1e-4);
    EXPECT_EQ(out.count, dense.count);
    out.sum.backward();
    EXPECT_TRUE(torch::allclose(local.grad(), dense_in.grad().narrow(-1, off, len), 1e-5, 1e-6));
  });
}

INSTANTIATE_TEST_SUITE_P(T, TensorParallelKinds, ::testing::Values(2, 4),
                         [](const auto& info) { return "tp" + std::to_string(info.param); });
