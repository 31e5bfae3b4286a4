// The split backward of weight-bearing products (include/hp/model/weight_grad.h):
// under SplitForward and Collect, backward (B) computes the input's gradient
// and no weight product, leaving the weights' .grad untouched; W (the
// queue's run) computes the weights' and biases' gradients with no autograd
// and no input product. Every gradient equals autograd's unsplit backward
// bitwise (the same products on the same operands as mm's and addmm's
// backward: gY^T X for a weight used transposed); W of several micro-batches
// sums as autograd accumulates (bitwise in the same order).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <vector>

#include "hp/model/moe.h"
#include "hp/model/precision.h"
#include "hp/model/weight_grad.h"

namespace {

namespace wgrad = hp::wgrad;

torch::Tensor seeded(std::vector<int64_t> shape, int seed) {
  auto g = torch::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randn(shape, g);
}

/// Two layers with a bias and one without, on a [batch, seq, in] input.
struct Mlp {
  torch::Tensor w1 = seeded({12, 8}, 1).requires_grad_(), b1 = seeded({12}, 2).requires_grad_();
  torch::Tensor w2 = seeded({8, 12}, 3).requires_grad_();
  torch::Tensor loss(const torch::Tensor& x) const {
    auto h = torch::gelu(hp::precision::linear(x, w1, b1));
    return hp::precision::linear(h, w2).pow(2).sum();
  }
  std::vector<torch::Tensor> params() const { return {w1, b1, w2}; }
  void clear() const {
    for (auto p : params()) p.mutable_grad() = torch::Tensor();
  }
};

std::vector<torch::Tensor> grads(const Mlp& m, const torch::Tensor& x) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.params()) out.push_back(p.grad().clone());
  out.push_back(x.grad().clone());
  return out;
}

void expect_bitwise(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(torch::equal(a[i], b[i])) << "gradient " << i << " max diff " << (a[i] - b[i]).abs().max().item<double>()
                                          << " of " << b[i].abs().max().item<double>() << " ratio "
                                          << (a[i] / b[i]).mean().item<double>();
}

/// B of `loss()` under the split (forward under SplitForward, backward
/// under a Collect): the W queue it leaves.
wgrad::WeightGradQueue split_backward(const std::function<torch::Tensor()>& loss) {
  wgrad::SplitForward split;
  auto l = loss();
  wgrad::Collect collect;
  l.backward();
  return collect.take();
}

TEST(WeightGradSplit, BComputesInputGradientsOnlyAndWTheWeightsWithoutAutograd) {
  const Mlp m;
  auto x = seeded({3, 5, 8}, 4).requires_grad_();
  m.loss(x).backward();
  const auto reference = grads(m, x);
  m.clear();
  x.mutable_grad() = torch::Tensor();

  wgrad::reset_counters();
  wgrad::WeightGradQueue queue = split_backward([&] { return m.loss(x); });
  // B: the input's gradient is there, no weight product ran.
  EXPECT_EQ(wgrad::counters().input_grad_products, 2u);
  EXPECT_EQ(wgrad::counters().weight_grad_products, 0u);
  EXPECT_EQ(wgrad::counters().deferred, 2u);
  for (const auto& p : m.params()) EXPECT_FALSE(p.grad().defined());
  EXPECT_TRUE(x.grad().defined());
  ASSERT_EQ(queue.size(), 2u);
  EXPECT_GT(queue.bytes(), 0);
  // W: plain products with gradient mode off, each parameter named once ready.
  std::vector<torch::Tensor> ready;
  EXPECT_EQ(queue.run([&](const at::Tensor& p) {
    EXPECT_FALSE(at::GradMode::is_enabled());
    ready.push_back(p);
  }),
            2u);
  EXPECT_TRUE(queue.empty());
  EXPECT_EQ(wgrad::counters().input_grad_products, 2u);
  EXPECT_EQ(wgrad::counters().weight_grad_products, 2u);
  ASSERT_EQ(ready.size(), 3u);  // w2 first (the last layer's backward runs first), then w1 and b1
  EXPECT_TRUE(ready[0].is_same(m.w2));
  for (const auto& p : m.params()) EXPECT_EQ(p.grad().grad_fn(), nullptr);
  expect_bitwise(grads(m, x), reference);
}

TEST(WeightGradSplit, WithoutACollectTheSplitBackwardComputesWAtOnce) {
  const Mlp m;
  auto x = seeded({4, 8}, 5).requires_grad_();
  m.loss(x).backward();
  const auto reference = grads(m, x);
  m.clear();
  x.mutable_grad() = torch::Tensor();
  wgrad::reset_counters();
  {
    wgrad::SplitForward split;
    m.loss(x).backward();
  }
  EXPECT_EQ(wgrad::counters().deferred, 0u);
  EXPECT_EQ(wgrad::counters().weight_grad_products, 2u);
  expect_bitwise(grads(m, x), reference);
}

TEST(WeightGradSplit, DeferredWeightGradientsAccumulateAcrossMicroBatches) {
  const Mlp m;
  auto x1 = seeded({2, 5, 8}, 6), x2 = seeded({2, 5, 8}, 7);
  m.loss(x1).backward();
  m.loss(x2).backward();
  std::vector<torch::Tensor> reference;
  for (const auto& p : m.params()) reference.push_back(p.grad().clone());
  m.clear();
  // Two micro-batches' B first, their W afterwards (a zero-bubble schedule
  // runs W whenever a stage would wait): in the same order bitwise, in the
  // other order within rounding.
  std::vector<wgrad::WeightGradQueue> queues;
  for (const auto& x : {x1, x2}) queues.push_back(split_backward([&] { return m.loss(x); }));
  for (const auto& p : m.params()) EXPECT_FALSE(p.grad().defined());
  auto q0 = queues[0], q1 = queues[1];
  queues[0].run();
  queues[1].run();
  for (std::size_t i = 0; i < reference.size(); ++i)
    EXPECT_TRUE(torch::equal(m.params()[i].grad(), reference[i])) << "parameter " << i;
  m.clear();
  q1.run();
  q0.run();
  for (std::size_t i = 0; i < reference.size(); ++i)
    EXPECT_TRUE(torch::allclose(m.params()[i].grad(), reference[i], 1e-6, 1e-4)) << "parameter " << i;
}

TEST(WeightGradSplit, OutsideSplitForwardTheProductIsAtenLinear) {
  const Mlp m;
  auto x = seeded({4, 8}, 8).requires_grad_();
  wgrad::reset_counters();
  auto y = hp::precision::linear(x, m.w1, m.b1);
  EXPECT_NE(std::string(y.grad_fn()->name()).find("Addmm"), std::string::npos) << y.grad_fn()->name();
  y.sum().backward();
  EXPECT_EQ(wgrad::counters().input_grad_products, 0u);
}

/// The other weight-bearing layers: an embedding, a layer norm with and
/// without a bias, an RMS-norm-style weight scale, and a head tied to the
/// embedding.
struct Stack {
  torch::Tensor emb = seeded({11, 8}, 11).requires_grad_();
  torch::Tensor ln_w = seeded({8}, 12).requires_grad_(), ln_b = seeded({8}, 13).requires_grad_();
  torch::Tensor ln2_w = seeded({8}, 14).requires_grad_();
  torch::Tensor g = seeded({8}, 15).requires_grad_();
  torch::Tensor loss(const torch::Tensor& ids) const {
    auto h = wgrad::embedding(emb, ids);
    h = torch::gelu(wgrad::layer_norm(h, 8, ln_w, ln_b, 1e-5));
    h = wgrad::layer_norm(h, 8, ln2_w, torch::Tensor(), 1e-5);
    h = wgrad::scale(h, g);
    return hp::precision::linear(h, emb).pow(2).sum();  // tied head
  }
  std::vector<torch::Tensor> params() const { return {emb, ln_w, ln_b, ln2_w, g}; }
};

// B computes the norms' and the scale's input gradients and no weight
// gradient (the embedding's B is nothing: ids have none); W computes every
// weight's without autograd; each equals autograd's unsplit one bitwise
// (one micro-batch: the tied weight's two uses sum alike either way).
TEST(WeightGradSplit, EmbeddingsNormsAndScalesSplitToo) {
  const Stack m;
  const auto ids = torch::randint(0, 11, {3, 5}, torch::make_generator<at::CPUGeneratorImpl>(16));
  m.loss(ids).backward();
  std::vector<torch::Tensor> reference;
  for (const auto& p : m.params()) reference.push_back(p.grad().clone());
  for (auto p : m.params()) p.mutable_grad() = torch::Tensor();

  wgrad::reset_counters();
  wgrad::WeightGradQueue queue = split_backward([&] { return m.loss(ids); });
  // B: the head's product, the scale and two norms' input gradients.
  EXPECT_EQ(wgrad::counters().input_grad_products, 4u);
  EXPECT_EQ(wgrad::counters().weight_grad_products, 0u);
  EXPECT_EQ(wgrad::counters().deferred, 5u);
  for (const auto& p : m.params()) EXPECT_FALSE(p.grad().defined());
  std::size_t cues = 0;
  EXPECT_EQ(queue.run([&](const at::Tensor&) {
    EXPECT_FALSE(at::GradMode::is_enabled());
    ++cues;
  }),
            5u);
  EXPECT_EQ(cues, 6u);  // the head's weight (no bias), the scale, two norm weights, one norm bias, the embedding
  EXPECT_EQ(wgrad::counters().input_grad_products, 4u);
  EXPECT_EQ(wgrad::counters().weight_grad_products, 5u);
  for (std::size_t i = 0; i < reference.size(); ++i) {
    EXPECT_EQ(m.params()[i].grad().grad_fn(), nullptr);
    EXPECT_TRUE(torch::equal(m.params()[i].grad(), reference[i]))
        << "parameter " << i << " max diff " << (m.params()[i].grad() - reference[i]).abs().max().item<double>();
  }
}

// The grouped expert FFN (packed and through BLAS): B the rows' gradient
// only, W the weights' and biases' (summed into .grad as the unsplit
// backward sums them), bitwise over two micro-batches with W run after
// both B's; an expert with no rows gets zero gradients either way.
TEST(WeightGradSplit, GroupedExpertFfnSplits) {
  for (auto how : {hp::ExpertCompute::kPacked, hp::ExpertCompute::kSlices}) {
    hp::ExpertWeights e;
    e.w1 = seeded({3, 32, 16}, 21).requires_grad_();
    e.b1 = seeded({3, 32}, 22).requires_grad_();
    e.w2 = seeded({3, 16, 32}, 23).requires_grad_();
    e.b2 = seeded({3, 16}, 24).requires_grad_();
    const std::vector<torch::Tensor> params{e.w1, e.b1, e.w2, e.b2};
    const std::vector<std::int64_t> counts{5, 0, 7};
    auto x1 = seeded({12, 16}, 25).requires_grad_(), x2 = seeded({12, 16}, 26).requires_grad_();
    auto loss = [&](const torch::Tensor& x) { return e.forward_grouped(x, counts, how).pow(2).sum(); };
    loss(x1).backward();
    loss(x2).backward();
    std::vector<torch::Tensor> reference;
    for (const auto& p : params) reference.push_back(p.grad().clone());
    reference.push_back(x1.grad().clone());
    for (auto p : params) p.mutable_grad() = torch::Tensor();
    x1.mutable_grad() = torch::Tensor();

    wgrad::reset_counters();
    std::vector<wgrad::WeightGradQueue> queues;
    for (const auto& x : {x1, x2}) queues.push_back(split_backward([&] { return loss(x); }));
    EXPECT_EQ(wgrad::counters().deferred, 2u);
    for (const auto& p : params) EXPECT_FALSE(p.grad().defined());
    std::size_t cues = 0;
    for (auto& q : queues) q.run([&](const at::Tensor&) { ++cues; });
    EXPECT_EQ(cues, 8u);  // w1, b1, w2, b2 per micro-batch
    for (std::size_t i = 0; i < params.size(); ++i)
      EXPECT_TRUE(torch::equal(params[i].grad(), reference[i])) << "parameter " << i;
    EXPECT_TRUE(torch::equal(x1.grad(), reference.back()));
  }
}

}  // namespace
