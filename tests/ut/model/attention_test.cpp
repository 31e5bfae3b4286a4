// Block (online-softmax) causal attention against the eager one: outputs and
// the gradients of q, k and v within max |a - b| / max |b| <= 1e-6 at
// sequence lengths 1 to 512 with block lengths that do and do not divide
// them; and at seq 4096 a forward + backward whose peak resident memory rise
// stays below what the [batch, heads, seq, seq] scores alone would take.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <vector>

#include "hp/model/block_attention.h"
#include "hp/model/layers.h"
#include "hp/trainer/training_metrics.h"

namespace {

/// max |a - b| / max |b|; max |a| when b is all zeros (at seq 1 the
/// softmax has one entry and q, k get no gradient).
double rel(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = b.abs().max().item<double>();
  return (a - b).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

struct Result {
  torch::Tensor out, dq, dk, dv;
};

/// q, k, v as the attention layer sees them: views of one projection
/// [B, T, h, 3, d] (not contiguous).
Result run(const torch::Tensor& qkv0, const torch::Tensor& dout, std::int64_t block,
           const torch::Tensor& docs = torch::Tensor()) {
  auto qkv = qkv0.clone().requires_grad_(true);
  auto parts = qkv.unbind(3);
  auto out = block > 0 ? hp::block_causal_attention(parts[0], parts[1], parts[2], block, docs)
                       : hp::causal_attention(parts[0], parts[1], parts[2], docs);
  out.backward(dout);
  auto g = qkv.grad().unbind(3);
  return {out.detach(), g[0], g[1], g[2]};
}

void check_seq(std::int64_t B, std::int64_t T, std::int64_t h, std::int64_t d,
               const std::vector<std::int64_t>& blocks) {
  auto qkv = torch::randn({B, T, h, 3, d});
  auto dout = torch::randn({B, T, h * d});
  const Result eager = run(qkv, dout, 0);
  double worst = 0;
  for (auto block : blocks) {
    const Result b = run(qkv, dout, block);
    const std::string at = "seq " + std::to_string(T) + " block " + std::to_string(block);
    const double r[] = {rel(b.out, eager.out), rel(b.dq, eager.dq), rel(b.dk, eager.dk),
                        rel(b.dv, eager.dv)};
    EXPECT_LE(r[0], 1e-6) << at << " output";
    EXPECT_LE(r[1], 1e-6) << at << " dq";
    EXPECT_LE(r[2], 1e-6) << at << " dk";
    EXPECT_LE(r[3], 1e-6) << at << " dv";
    for (double x : r) worst = std::max(worst, x);
  }
  std::cout << "seq " << T
            << ": largest max|block - eager| / max|eager| over output, dq, dk, dv: " << worst
            << "\n";
}

TEST(BlockAttention, MatchesEagerShortSequences) {
  torch::manual_seed(0);
  check_seq(2, 1, 3, 8, {1, 4});
  check_seq(2, 2, 3, 8, {1, 2, 3});
  check_seq(2, 7, 3, 8, {1, 2, 3, 7, 16});
  check_seq(2, 64, 3, 16, {5, 8, 64, 128});
}

TEST(BlockAttention, MatchesEagerLongSequences) {
  torch::manual_seed(1);
  check_seq(2, 130, 2, 16, {13, 32, 65, 128, 130});
  check_seq(1, 512, 2, 32, {64, 100, 128, 512});
}

TEST(BlockAttention, LargeScoresStayFinite) {
  // Scores of hundreds: a softmax without the running maximum overflows.
  // The bar is 1e-5 here, not 1e-6: at |s| ~ 1000 one ulp of a score
  // (6e-5) moves exp(s - m) by as much, so any two fp32 evaluations whose
  // score matmuls round differently (eager's [T, T] product against block's
  // [block, block] ones, or BLAS kernels by shape) differ by ~1e-6 to 1e-5,
  // as FlashAttention's do; at unit-scale scores (above) they meet 1e-6.
  // Against a float64 evaluation, block is held to the same 1e-5.
  torch::manual_seed(2);
  auto qkv = torch::randn({1, 50, 2, 3, 16}) * 8;
  auto dout = torch::randn({1, 50, 2 * 16});
  const Result eager = run(qkv, dout, 0), b = run(qkv, dout, 16);
  const Result f64 = run(qkv.to(torch::kDouble), dout.to(torch::kDouble), 0);
  ASSERT_TRUE(torch::isfinite(b.out).all().item<bool>());
  ASSERT_TRUE(torch::isfinite(b.dq).all().item<bool>());
  auto worst = [&](const Result& x, const Result& ref) {
    return std::max({rel(x.out.to(torch::kDouble), ref.out.to(torch::kDouble)),
                     rel(x.dq.to(torch::kDouble), ref.dq.to(torch::kDouble)),
                     rel(x.dk.to(torch::kDouble), ref.dk.to(torch::kDouble)),
                     rel(x.dv.to(torch::kDouble), ref.dv.to(torch::kDouble))});
  };
  std::cout << "scores of hundreds: block against eager " << worst(b, eager) << ", against float64 "
            << worst(b, f64) << " (eager against float64 " << worst(eager, f64) << ")\n";
  EXPECT_LE(worst(b, eager), 1e-5);
  EXPECT_LE(worst(b, f64), 1e-5);
}

// model.attention: auto is block from model.attention_auto_seq on, eager
// below it; eager and block stay themselves at any length.
TEST(BlockAttention, AutoPicksBlockFromTheThreshold) {
  EXPECT_EQ(hp::resolve_attention("auto", 511, 512), "eager");
  EXPECT_EQ(hp::resolve_attention("auto", 512, 512), "block");
  EXPECT_EQ(hp::resolve_attention("auto", 4096, 512), "block");
  EXPECT_EQ(hp::resolve_attention("eager", 4096, 512), "eager");
  EXPECT_EQ(hp::resolve_attention("block", 1, 512), "block");
}

// Each head runs on one thread with single-threaded ops: the same bits at
// one and two intra-op threads.
TEST(BlockAttention, SameBitsAtOneAndTwoThreads) {
  torch::manual_seed(5);
  auto qkv = torch::randn({2, 100, 3, 3, 16});
  auto dout = torch::randn({2, 100, 3 * 16});
  const int threads = torch::get_num_threads();
  torch::set_num_threads(1);
  const Result one = run(qkv, dout, 32);
  torch::set_num_threads(2);
  const Result two = run(qkv, dout, 32);
  torch::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one.out, two.out));
  EXPECT_TRUE(torch::equal(one.dq, two.dq));
  EXPECT_TRUE(torch::equal(one.dk, two.dk));
  EXPECT_TRUE(torch::equal(one.dv, two.dv));
}

TEST(BlockAttention, RefusesBadArguments) {
  auto x = torch::randn({1, 4, 1, 2});
  EXPECT_THROW(hp::block_causal_attention(x, x, x, 0), std::invalid_argument);
  EXPECT_THROW(hp::block_causal_attention(x, x, torch::randn({1, 5, 1, 2}), 2),
               std::invalid_argument);
}

TEST(BlockAttention, Seq4096PeakMemoryBelowTheScoreMatrix) {
  const std::int64_t B = 1, T = 4096, h = 4, d = 64;
  const double scores_bytes = static_cast<double>(B * h * T * T) * sizeof(float);  // 256 MiB
  torch::manual_seed(3);
  auto qkv = torch::randn({B, T, h, 3, d}).requires_grad_(true);
  auto dout = torch::randn({B, T, h * d});
  const double before = hp::reset_peak_resident_memory();
  {
    auto parts = qkv.unbind(3);
    auto out = hp::block_causal_attention(parts[0], parts[1], parts[2], 128);
    out.backward(dout);
  }
  const double rise = hp::peak_resident_memory_since_reset() - before;
  ASSERT_TRUE(qkv.grad().defined());
  EXPECT_TRUE(torch::isfinite(qkv.grad()).all().item<bool>());
  std::cout << "seq 4096 block attention forward + backward: peak resident rise "
            << rise / 1048576.0 << " MiB; the scores alone: " << scores_bytes / 1048576.0
            << " MiB\n";
  EXPECT_GT(rise, 0.0) << "the peak did not move: the measurement is broken";
  EXPECT_LT(rise, scores_bytes);
}

}  // namespace

namespace {

// Document numbers of a sample from its document lengths.
torch::Tensor docs_of(const std::vector<std::int64_t>& lengths) {
  std::vector<std::int64_t> d;
  for (std::size_t i = 0; i < lengths.size(); ++i) d.insert(d.end(), lengths[i], static_cast<std::int64_t>(i));
  return torch::tensor(d, torch::kLong);
}

}  // namespace

// Attention inside documents: each document's positions get what causal
// attention over that document alone gives them (outputs and gradients),
// in the eager path and the block path (blocks crossing, ending at and
// skipping document boundaries).
TEST(DocumentAttention, EachDocumentAsIfAlone) {
  torch::manual_seed(5);
  const std::int64_t T = 24, h = 2, d = 4;
  const std::vector<std::vector<std::int64_t>> samples = {{5, 1, 9, 9}, {24}, {1, 1, 1, 21}, {12, 12}};
  std::vector<torch::Tensor> rows;
  for (const auto& s : samples) rows.push_back(docs_of(s));
  const auto docs = torch::stack(rows);
  const auto B = docs.size(0);
  auto qkv = torch::randn({B, T, h, 3, d});
  auto dout = torch::randn({B, T, h * d});
  const Result eager = run(qkv, dout, 0, docs);
  // The reference: each document through causal attention on its own.
  for (std::int64_t b = 0; b < B; ++b) {
    std::int64_t at = 0;
    for (auto len : samples[static_cast<std::size_t>(b)]) {
      const Result alone = run(qkv.narrow(0, b, 1).narrow(1, at, len), dout.narrow(0, b, 1).narrow(1, at, len), 0);
      const std::string where = "sample " + std::to_string(b) + " document at " + std::to_string(at);
      EXPECT_LE(rel(eager.out.narrow(0, b, 1).narrow(1, at, len), alone.out), 1e-6) << where;
      EXPECT_LE(rel(eager.dq.narrow(0, b, 1).narrow(1, at, len), alone.dq), 1e-6) << where;
      EXPECT_LE(rel(eager.dk.narrow(0, b, 1).narrow(1, at, len), alone.dk), 1e-6) << where;
      EXPECT_LE(rel(eager.dv.narrow(0, b, 1).narrow(1, at, len), alone.dv), 1e-6) << where;
      at += len;
    }
  }
  for (std::int64_t block : {1, 3, 5, 8, 24, 64}) {
    const Result blk = run(qkv, dout, block, docs);
    const std::string where = "block " + std::to_string(block);
    EXPECT_LE(rel(blk.out, eager.out), 1e-6) << where;
    EXPECT_LE(rel(blk.dq, eager.dq), 1e-6) << where;
    EXPECT_LE(rel(blk.dk, eager.dk), 1e-6) << where;
    EXPECT_LE(rel(blk.dv, eager.dv), 1e-6) << where;
  }
  // And the mask does something: without documents the outputs differ.
  EXPECT_GT(rel(run(qkv, dout, 0).out, eager.out), 1e-3);
}

TEST(DocumentAttention, RefusesDocumentsOfOtherSamples) {
  auto x = torch::randn({2, 6, 1, 4});
  try {
    hp::causal_attention(x, x, x, torch::zeros({1, 6}, torch::kLong));
    ADD_FAILURE() << "documents of 1 sample accepted for 2";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("documents are [1, 6] but the attention holds [2, 6]"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("gathers other ranks' samples"), std::string::npos) << e.what();
  }
  EXPECT_THROW(hp::block_causal_attention(x, x, x, 2, torch::zeros({2, 5}, torch::kLong)), std::invalid_argument);
}
