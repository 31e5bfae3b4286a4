// The calibration's emulation of ZeRO 2-3's gradient reduction
// (framework/plan/emulated_slicer.h), on five parameters with gradients
// known in closed form: buckets cut in reverse order by the reducers' rule,
// each launched from the backward's hooks once its micro-batch's gradients
// are complete, its parameters' gradients released, no more than
// kBucketsInFlight travelling after a launch, and each bucket's half the
// first half of its flat gradients summed over the micro-batches.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <string>
#include <vector>

#include "framework/plan/emulated_slicer.h"
#include "hp/optim/buckets.h"

namespace {

/// Five parameters of 256 floats (1 KiB each); parameter i's loss term is
/// sum(p_i * x_i), so its gradient is x_i, a micro-batch's own.
std::vector<hp::ParamEntry> five_params() {
  std::vector<hp::ParamEntry> params;
  for (int i = 0; i < 5; ++i) {
    hp::ParamEntry e;
    e.spec.name = "p" + std::to_string(i);
    e.tensor = at::zeros({256}).requires_grad_();
    e.block = i;
    params.push_back(e);
  }
  return params;
}

at::Tensor input(int micro_batch, int param) {
  return at::arange(256, at::kFloat) * 0.01 + static_cast<double>(10 * micro_batch + param);
}

void backward(const std::vector<hp::ParamEntry>& params, int micro_batch) {
  c10::AutoGradMode grad(true);
  at::Tensor loss = at::zeros({});
  for (std::size_t i = 0; i < params.size(); ++i)
    loss = loss + (params[i].tensor * input(micro_batch, static_cast<int>(i))).sum();
  loss.backward();
}

}  // namespace

TEST(EmulatedSlicer, BucketsTravelAtMostTwoAndSumTheFirstHalves) {
  auto params = five_params();
  // 2 KiB buckets over 1 KiB parameters: two a bucket, the last alone,
  // from the last parameter back.
  hp::plan::EmulatedSlicer slicer(params, 2048);
  const std::vector<std::vector<std::size_t>> expected{{4, 3}, {2, 1}, {0}};
  ASSERT_EQ(slicer.buckets(), expected);
  EXPECT_DOUBLE_EQ(slicer.half_bytes(), (256 + 256 + 128) * 4.0);  // halves of 512, 512 and 256 floats
  const int micro = 3;
  for (int step = 0; step < 2; ++step) {
    slicer.begin_step(micro);
    for (int mb = 0; mb < micro; ++mb) {
      backward(params, mb);
      // Launched from the hooks during the backward: every gradient of
      // this micro-batch already released.
      for (const auto& p : params) EXPECT_FALSE(p.tensor.grad().defined()) << p.spec.name << " micro-batch " << mb;
    }
    slicer.end_backward();
    EXPECT_EQ(slicer.launches(), static_cast<std::size_t>((step + 1) * micro * 3));
  }
  EXPECT_EQ(slicer.peak_in_flight(), hp::kBucketsInFlight);
  // Each half: the bucket's gradients flattened in its order (4 then 3,
  // 2 then 1, 0), its first half, summed over 3 micro-batches x 2 steps.
  for (std::size_t b = 0; b < expected.size(); ++b) {
    std::vector<at::Tensor> flat;
    for (std::size_t i : expected[b]) {
      at::Tensor sum = at::zeros({256});
      for (int mb = 0; mb < micro; ++mb) sum += input(mb, static_cast<int>(i));
      flat.push_back(2 * sum);
    }
    const at::Tensor whole = at::cat(flat);
    const at::Tensor want = whole.narrow(0, 0, (whole.numel() + 1) / 2);
    EXPECT_TRUE(at::allclose(slicer.halves()[b], want, 1e-6, 1e-4)) << "bucket " << b;
  }
}

// A bucket larger than the limit holds one parameter; with one bucket
// nothing waits behind it.
TEST(EmulatedSlicer, OneParameterABucketBelowItsSize) {
  auto params = five_params();
  hp::plan::EmulatedSlicer slicer(params, 100);
  ASSERT_EQ(slicer.buckets().size(), 5u);
  EXPECT_EQ(slicer.buckets().front(), (std::vector<std::size_t>{4}));
  slicer.begin_step(1);
  backward(params, 0);
  slicer.end_backward();
  EXPECT_EQ(slicer.launches(), 5u);
  EXPECT_EQ(slicer.peak_in_flight(), hp::kBucketsInFlight);
  EXPECT_TRUE(at::allclose(slicer.halves()[0], input(0, 4).narrow(0, 0, 128)));
}
