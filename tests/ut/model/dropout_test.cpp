// Layout-free dropout: a mask element is a pure function of (seed, step,
// global sample, layer, global position, feature), so a slice of the batch
// or of the sequence draws exactly the elements the whole would.
#include "hp/model/dropout.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace {

using hp::DropoutSite;

at::Tensor mask(std::int64_t samples, std::int64_t seq, std::int64_t offset, DropoutSite site,
                std::uint64_t layer = 11, std::uint64_t seed = 7, double p = 0.1) {
  return hp::layout_free_dropout_mask(samples, seq, 16, p, seed, layer, offset, site);
}

TEST(LayoutFreeDropout, ABatchSliceDrawsTheWholeBatchsElements) {
  at::Tensor whole = mask(8, 12, 0, {3, 0});
  // Replica 1 of dp=2, its second micro-batch of 2: samples 6 and 7.
  at::Tensor part = mask(2, 12, 0, {3, 6});
  EXPECT_TRUE(at::equal(part, whole.narrow(0, 6, 2)));
}

TEST(LayoutFreeDropout, ASequenceSliceDrawsTheWholeSequencesElements) {
  at::Tensor whole = mask(4, 12, 0, {3, 0});
  for (int r = 0; r < 3; ++r) {
    at::Tensor part = mask(4, 4, 4 * r, {3, 0});
    EXPECT_TRUE(at::equal(part, whole.narrow(1, 4 * r, 4))) << "slice " << r;
  }
}

TEST(LayoutFreeDropout, StepLayerSeedAndSampleEachChangeTheMask) {
  at::Tensor base = mask(4, 12, 0, {3, 0});
  EXPECT_TRUE(at::equal(base, mask(4, 12, 0, {3, 0})));
  EXPECT_FALSE(at::equal(base, mask(4, 12, 0, {4, 0})));
  EXPECT_FALSE(at::equal(base, mask(4, 12, 0, {3, 0}, 12)));
  EXPECT_FALSE(at::equal(base, mask(4, 12, 0, {3, 0}, 11, 8)));
  EXPECT_FALSE(at::equal(base.narrow(0, 1, 3), mask(3, 12, 0, {3, 0})));
}

TEST(LayoutFreeDropout, DropsAFractionPAndScalesTheRest) {
  const double p = 0.25;
  at::Tensor m = mask(64, 64, 0, {1, 0}, 5, 9, p);
  const double dropped = (m == 0).to(at::kDouble).mean().item<double>();
  // 65536 Bernoulli(0.25) draws: standard deviation 0.0017.
  EXPECT_NEAR(dropped, p, 0.01);
  const float keep = static_cast<float>(1.0 / (1.0 - p));
  EXPECT_TRUE(((m == 0) | (m == keep)).all().item<bool>());
  // Neighbouring features and positions are not correlated.
  at::Tensor a = (m.narrow(2, 0, 15) == 0).to(at::kDouble),
             b = (m.narrow(2, 1, 15) == 0).to(at::kDouble);
  EXPECT_NEAR((a * b).mean().item<double>(), p * p, 0.01);
}

TEST(LayoutFreeDropout, AppliesAtTheCurrentSiteAndRestoresThePrevious) {
  at::Tensor x = at::ones({2, 12, 16});
  at::Tensor y;
  {
    hp::DropoutSiteGuard g({5, 2});
    y = hp::layout_free_dropout(x, 0.1, 7, 11);
    EXPECT_EQ(hp::current_dropout_site().first_sample, 2);
  }
  EXPECT_EQ(hp::current_dropout_site().step, 0);
  EXPECT_TRUE(at::equal(y, mask(2, 12, 0, {5, 2})));
  EXPECT_TRUE(at::equal(hp::layout_free_dropout(x, 0.0, 7, 11), x));
  EXPECT_NE(hp::stable_hash("blocks.0.drop"), hp::stable_hash("blocks.1.drop"));
  EXPECT_EQ(hp::stable_hash("a"), 0xaf63dc4c8601ec8cULL);  // FNV-1a 64 of "a"
}

}  // namespace
