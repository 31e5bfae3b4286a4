// Each tensor-parallel layer kind against its dense twin at T = 2 and 4:
// outputs and every gradient (the parallel gradient of each parameter must
// equal its slice of the dense gradient), including an uneven vocabulary.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mutex>

#include "hp/config/config.h"
#include "hp/model/layers.h"
#include "hp/model/model.h"
#include "framework/model/registry.h"
#include "hp/optim/grad_sync.h"
#include "framework/runtime/setup.h"
#include "plugins/tensor_parallel/layers.h"
#include "tests/support/multi_rank.h"

namespace {

struct Result {
  torch::Tensor out, input_grad;
  std::vector<hp::ParamEntry> params;
};

hp::dist::DistributedContext& one() {
  static auto ctx = hp::dist::DistributedContext::single();
  return *ctx;
}

const hp::Config& config() {
  static hp::Setup s = hp::prepare(hp::RawConfig::parse_string("data: {type: synthetic}\nmodel: {vocab_size: 66}", "t"), 1);
  return s.config;
}

/// Builds `spec` with `registry`, runs it on `x` (ids for embeddings), and
/// back-propagates <out, w> for a fixed w.
Result run(const hp::LayerSpec& spec, const hp::LayerRegistry& registry, hp::dist::DistributedContext* d,
           const torch::Tensor& x) {
  hp::BuildContext ctx(config(), d ? *d : one(), registry, 99);
  auto layer = registry.make(spec, ctx);
  auto in = x.is_floating_point() ? x.clone().requires_grad_(true) : x;
  auto out = layer->forward(in);
  auto w = torch::randn(out.sizes(), torch::make_generator<at::CPUGeneratorImpl>(7));
  (out * w).sum().backward();
  return {out.detach(), in.requires_grad() ? in.grad() : torch::Tensor(), ctx.params()};
}

/// Every parameter gradient equals its slice of the dense gradient (a whole
/// parameter: the whole dense gradient).
void expect_grads_match(const std::vector<hp::ParamEntry>& par, const std::vector<hp::ParamEntry>& dense,
                        double rtol = 1e-5) {
  ASSERT_EQ(par.size(), dense.size());
  for (std::size_t i = 0; i < par.size(); ++i) {
    const auto& p = par[i];
    auto full = dense[i].tensor.grad();
    auto expect = p.spec.box.offsets.empty() ? full : hp::dist::slice_of(full, p.spec.box);
    EXPECT_TRUE(torch::allclose(p.tensor.grad(), expect, rtol, 1e-6)) << p.spec.name;
  }
}

/// Sums the gradients as the trainer does after backward (sequence
/// parallel's replicated parameters: over tp).
void sync_grads(hp::dist::DistributedContext& d, const std::vector<hp::ParamEntry>& params) {
  hp::make_bucketed_reducer({1 << 20}, params, d)->reduce();
}

void expect_same(const Result& dense, const Result& par) {
  EXPECT_TRUE(torch::allclose(par.out, dense.out, 1e-5, 1e-6)) << "forward";
  if (dense.input_grad.defined()) {
    EXPECT_TRUE(torch::allclose(par.input_grad, dense.input_grad, 1e-5, 1e-6)) << "input gradient";
  }
  expect_grads_match(par.params, dense.params);
}

void check_kind(int T, const hp::LayerSpec& spec, const torch::Tensor& x) {
  auto dense = run(spec, hp::LayerRegistry::dense(), nullptr, x);
  hp::test::run_ranks(hp::test::grid(1, 1, T), [&](hp::dist::DistributedContext& d) {
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
  hp::BuildContext dctx(config(), one(), hp::LayerRegistry::dense(), 1);
  auto dense_in = logits.clone().requires_grad_(true);
  auto dense = hp::LayerRegistry::dense().make_loss({"loss.cross_entropy", "loss", 0, 66}, dctx)->forward(dense_in, targets);
  dense.sum.backward();
  hp::test::run_ranks(hp::test::grid(1, 1, T), [&](hp::dist::DistributedContext& d) {
    auto registry = hp::LayerRegistry::dense();
    hp::tensor_parallel::replace_kinds(registry, "tensor_parallel");
    hp::BuildContext ctx(config(), d, registry, 1);
    auto [off, len] = hp::split_range(66, T, d.group("tp").rank());
    auto local = logits.narrow(-1, off, len).clone().requires_grad_(true);
    auto out = registry.make_loss({"loss.cross_entropy", "loss", 0, 66}, ctx)->forward(local, targets);
    EXPECT_NEAR(out.sum.item<double>(), dense.sum.item<double>(), 1e-4);
    EXPECT_EQ(out.count, dense.count);
    out.sum.backward();
    EXPECT_TRUE(torch::allclose(local.grad(), dense_in.grad().narrow(-1, off, len), 1e-5, 1e-6));
  });
}

// The vocabulary-parallel loss needs the vocabulary size from the spec (it
// never reads a model's options).
TEST(TensorParallelLoss, WithoutTheVocabularySizeIsAModelError) {
  hp::test::run_ranks(hp::test::grid(1, 1, 2), [&](hp::dist::DistributedContext& d) {
    auto registry = hp::LayerRegistry::dense();
    hp::tensor_parallel::replace_kinds(registry, "tensor_parallel");
    hp::BuildContext ctx(config(), d, registry, 1);
    try {
      registry.make_loss({"loss.cross_entropy", "loss"}, ctx);
      FAIL() << "built without a vocabulary size";
    } catch (const std::invalid_argument& e) {
      EXPECT_STREQ(e.what(), "model error: loss.cross_entropy 'loss' under tensor parallel needs the vocabulary size as "
                             "LayerSpec::out (the logits are split over it)");
    }
  });
}

INSTANTIATE_TEST_SUITE_P(T, TensorParallelKinds, ::testing::Values(2, 4),
                         [](const auto& info) { return "tp" + std::to_string(info.param); });

// ---- Sequence parallel -----------------------------------------------------
// Each rank feeds its slice of the sequence (or the full token ids) and gets
// its slice of the dense output (along the sequence, or along the features
// for a column layer that keeps its output split). Back-propagating each
// rank's slice of one fixed weighting sums to the dense objective, so every
// gradient must equal its slice of the dense gradient (replicated
// parameters: the whole dense gradient).

namespace {

enum class OutSlice { kSequence, kFeatures };

void check_sequence_parallel(int T, const hp::LayerSpec& spec, const torch::Tensor& x, OutSlice how,
                             bool input_is_sequence_slice = true) {
  hp::BuildContext dctx(config(), one(), hp::LayerRegistry::dense(), 99);
  auto dense_layer = hp::LayerRegistry::dense().make(spec, dctx);
  auto din = x.is_floating_point() ? x.clone().requires_grad_(true) : x;
  auto dout = dense_layer->forward(din);
  auto w = torch::randn(dout.sizes(), torch::make_generator<at::CPUGeneratorImpl>(7));
  (dout * w).sum().backward();
  const auto seq = x.size(1);
  hp::test::run_ranks(hp::test::grid(1, 1, T), [&](hp::dist::DistributedContext& d) {
    auto registry = hp::LayerRegistry::dense();
    hp::tensor_parallel::replace_kinds(registry, "tensor_parallel", {/*sequence_parallel=*/true});
    hp::BuildContext ctx(config(), d, registry, 99);
    auto layer = registry.make(spec, ctx);
    const int r = d.group("tp").rank();
    const auto len = seq / T;
    auto in = input_is_sequence_slice ? x.narrow(1, r * len, len).clone().requires_grad_(true) : x;
    auto out = layer->forward(in);
    auto slice = [&](const torch::Tensor& t) {
      if (how == OutSlice::kSequence) return t.narrow(1, r * len, len);
      auto [off, n] = hp::split_range(t.size(-1), T, r);
      return t.narrow(-1, off, n);
    };
    ASSERT_EQ(out.sizes(), slice(dout).sizes());
    EXPECT_TRUE(torch::allclose(out, slice(dout.detach()), 1e-5, 1e-6)) << "forward";
    (out * slice(w)).sum().backward();
    if (input_is_sequence_slice) {
      EXPECT_TRUE(torch::allclose(in.grad(), din.grad().narrow(1, r * len, len), 1e-5, 1e-6))
          << "input gradient";
    }
    sync_grads(d, ctx.params());
    expect_grads_match(ctx.params(), dctx.params());
  });
}

class SequenceParallelKinds : public ::testing::TestWithParam<int> {};

}  // namespace

TEST_P(SequenceParallelKinds, ColumnLinearGathersTheSequence) {
  check_sequence_parallel(GetParam(), hp::LayerSpec{"linear.column", "c", 16, 24}.with_gather_output(false),
                          act(), OutSlice::kFeatures);
}

TEST_P(SequenceParallelKinds, ColumnLinearGatheredOutputBackToSequenceSlice) {
  check_sequence_parallel(GetParam(), hp::LayerSpec{"linear.column", "c", 16, 24}, act(), OutSlice::kSequence);
}

TEST_P(SequenceParallelKinds, RowLinearReduceScattersTheSequence) {
  check_sequence_parallel(GetParam(), hp::LayerSpec{"linear.row", "r", 16, 12}, act(), OutSlice::kSequence);
}

TEST_P(SequenceParallelKinds, LayerNormOnSliceSumsParameterGradients) {
  check_sequence_parallel(GetParam(), hp::LayerSpec{"layer_norm", "ln", 16}, act(), OutSlice::kSequence);
}

TEST_P(SequenceParallelKinds, PositionsOfTheSlice) {
  check_sequence_parallel(GetParam(), hp::LayerSpec{"embedding.position", "pos", 8, 16}, act(),
                          OutSlice::kSequence);
}

TEST_P(SequenceParallelKinds, VocabularyEmbeddingReduceScatters) {
  auto ids = torch::randint(0, 66, {2, 8}, torch::make_generator<at::CPUGeneratorImpl>(5));
  check_sequence_parallel(GetParam(), hp::LayerSpec{"embedding.vocab", "e", 66, 16}, ids, OutSlice::kSequence,
                          /*input_is_sequence_slice=*/false);
}

TEST_P(SequenceParallelKinds, AttentionRegion) {
  hp::LayerSpec s{"attention.heads", "a", 16, 16};
  s.heads = 4;
  check_sequence_parallel(GetParam(), s, act(), OutSlice::kSequence);
}

TEST_P(SequenceParallelKinds, MlpRegion) {
  check_sequence_parallel(GetParam(), hp::LayerSpec{"mlp", "m", 16, 32}, act(), OutSlice::kSequence);
}

// Dropout under sequence parallel applies the mask elements the dense layer
// draws at this rank's positions (a function of the global position; no
// generator, no communication). The ranks are threads here, each at the
// default dropout site, as the dense layer.
TEST_P(SequenceParallelKinds, DropoutMaskIsTheSliceOfTheDenseMask) {
  const int T = GetParam();
  const auto x = act();
  hp::LayerSpec spec{"dropout", "d"};
  spec.with_dropout(0.3);
  hp::BuildContext dctx(config(), one(), hp::LayerRegistry::dense(), 1);
  auto dense_layer = hp::LayerRegistry::dense().make(spec, dctx);
  const auto dense = dense_layer->forward(x);
  ASSERT_FALSE(torch::equal(dense, x)) << "dropout did nothing";
  hp::test::run_ranks(hp::test::grid(1, 1, T), [&](hp::dist::DistributedContext& d) {
    auto registry = hp::LayerRegistry::dense();
    hp::tensor_parallel::replace_kinds(registry, "tensor_parallel", {/*sequence_parallel=*/true});
    hp::BuildContext ctx(config(), d, registry, 1);
    auto layer = registry.make(spec, ctx);
    const int r = d.group("tp").rank();
    const auto len = x.size(1) / T;
    const torch::Tensor out = layer->forward(x.narrow(1, r * len, len));
    EXPECT_TRUE(torch::equal(out, dense.narrow(1, r * len, len)));
    layer->eval();
    EXPECT_TRUE(torch::equal(layer->forward(x), x)) << "dropout in eval";
  });
}

// The whole gpt (embedding, two pre-LN blocks, head, parallel cross entropy)
// under sequence parallel against the dense model: loss and every gradient.
TEST_P(SequenceParallelKinds, GptModelAgainstDense) {
  const int T = GetParam();
  static hp::Setup s = hp::prepare(
      hp::RawConfig::parse_string("data: {type: synthetic}\nmodel: {type: gpt, vocab_size: 66, hidden: 16, "
                                  "heads: 4, seq_len: 8, layers: 2, dropout: 0.0}", "t"), 1);
  auto desc = hp::describe_model(s.config);
  auto tokens = torch::randint(0, 66, {2, 8}, torch::make_generator<at::CPUGeneratorImpl>(21));
  auto targets = torch::randint(0, 66, {2, 8}, torch::make_generator<at::CPUGeneratorImpl>(22));
  auto dense_registry = hp::LayerRegistry::dense();
  hp::BuildContext dctx(s.config, one(), dense_registry, 5);
  auto dense = hp::build_model(desc, dctx);
  auto dloss = dense.loss->forward(dense.forward(hp::make_activations({{"tokens", tokens}})), hp::make_activations({{"labels", targets}}));
  dloss.sum.backward();
  hp::test::run_ranks(hp::test::grid(1, 1, T), [&](hp::dist::DistributedContext& d) {
    auto registry = hp::LayerRegistry::dense();
    hp::tensor_parallel::replace_kinds(registry, "tensor_parallel", {/*sequence_parallel=*/true});
    hp::BuildContext ctx(s.config, d, registry, 5);
    auto m = hp::build_model(desc, ctx);
    auto out = m.forward(hp::make_activations({{"tokens", tokens}}));
    EXPECT_EQ(out["logits"].size(1), 8) << "logits cover the whole sequence";
    auto loss = m.loss->forward(out, hp::make_activations({{"labels", targets}}));
    EXPECT_NEAR(loss.sum.item<double>(), dloss.sum.item<double>(), 1e-4);
    loss.sum.backward();
    sync_grads(d, m.params);
    expect_grads_match(m.params, dense.params, 1e-4);
  });
}

INSTANTIATE_TEST_SUITE_P(T, SequenceParallelKinds, ::testing::Values(2, 4),
                         [](const auto& info) { return "tp" + std::to_string(info.param); });

// The gradient sync sums each parameter over the dimensions its gradient
// is partial over; tp then dp for sequence parallel's replicated parameters.
TEST(GradSyncGroups, SumsOverEachNamedGroup) {
  hp::test::run_ranks(hp::test::grid(1, 2, 2), [](hp::dist::DistributedContext& d) {
    std::vector<hp::ParamEntry> params;
    for (const std::vector<std::string>& groups : {std::vector<std::string>{"dp"}, {"tp"}, {"tp", "dp"}}) {
      hp::ParamEntry e;
      e.spec.name = groups.size() == 1 ? groups[0] : "tp then dp";
      for (const auto& g : groups) e.spec.grad.push_back({g, hp::dist::Placement::partial()});
      e.tensor = torch::zeros({3}).requires_grad_(true);
      e.tensor.mutable_grad() = torch::full({3}, static_cast<double>(d.rank() + 1));
      params.push_back(e);
    }
    hp::make_bucketed_reducer({8}, params, d)->reduce();  // 8 bytes: one tensor per bucket
    // Ranks 0..3 are (dp, tp) = (0,0) (0,1) (1,0) (1,1): values 1..4.
    const double dp_sum = d.mesh().group_index("tp", d.rank()) == 0 ? 1 + 3 : 2 + 4;
    const double tp_sum = d.mesh().group_index("dp", d.rank()) == 0 ? 1 + 2 : 3 + 4;
    EXPECT_TRUE(torch::allclose(params[0].tensor.grad(), torch::full({3}, dp_sum)));
    EXPECT_TRUE(torch::allclose(params[1].tensor.grad(), torch::full({3}, tp_sum)));
    EXPECT_TRUE(torch::allclose(params[2].tensor.grad(), torch::full({3}, 10.0)));
  });
}
