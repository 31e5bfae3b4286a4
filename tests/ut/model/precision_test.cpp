// The mixed-precision products and casts (include/hp/model/precision.h):
// fp32 inputs are ATen's own ops bitwise; the widening kernel gives a bf16
// product with fp32 accumulation (the fp32 product of the bf16 values,
// rounded once), its gradients are the fp32 formulas on the saved bf16
// operands rounded once (activation memory: bench/bench_precision.sh);
// the native kernel agrees with it within bf16 rounding; block attention in
// bf16 follows eager attention in bf16.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hp/model/block_attention.h"
#include "hp/model/layers.h"
#include "hp/model/precision.h"

namespace {

using hp::precision::ProductKernel;

torch::Tensor randn(std::vector<int64_t> shape, int seed) {
  auto g = torch::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randn(shape, g);
}

/// Sets the product kernel for one test and restores it.
struct KernelScope {
  ProductKernel before = hp::precision::product_kernel();
  explicit KernelScope(ProductKernel k) { hp::precision::set_product_kernel(k); }
  ~KernelScope() { hp::precision::set_product_kernel(before); }
};

TEST(Precision, Fp32IsAtensOwnOpsBitwise) {
  auto x = randn({3, 5, 8}, 1), w = randn({6, 8}, 2), b = randn({6}, 3);
  EXPECT_TRUE(torch::equal(hp::precision::linear(x, w, b), at::linear(x, w, b)));
  EXPECT_TRUE(torch::equal(hp::precision::linear(x, w), at::linear(x, w)));
  auto a = randn({2, 4, 5}, 4), c = randn({2, 5, 3}, 5);
  EXPECT_TRUE(torch::equal(hp::precision::matmul(a, c), at::matmul(a, c)));
  EXPECT_TRUE(hp::precision::cast(x, at::kFloat).is_same(x));
  EXPECT_TRUE(hp::precision::in_fp32(x, [](const at::Tensor& t) { return t * 2; }).equal(x * 2));
}

TEST(Precision, WideningLinearIsTheFp32ProductOfTheBf16ValuesRoundedOnce) {
  KernelScope k(ProductKernel::kWiden);
  auto x = randn({4, 7, 16}, 6).to(at::kBFloat16).requires_grad_(true);
  auto w = randn({12, 16}, 7).requires_grad_(true);  // an fp32 master, cast at use
  auto b = randn({12}, 8).requires_grad_(true);
  auto y = hp::precision::linear(x, w, b);
  ASSERT_EQ(y.scalar_type(), at::kBFloat16);
  const auto w16 = w.detach().to(at::kBFloat16).to(at::kFloat), b16 = b.detach().to(at::kBFloat16).to(at::kFloat);
  const auto xf = x.detach().to(at::kFloat);
  EXPECT_TRUE(torch::equal(y, at::linear(xf, w16, b16).to(at::kBFloat16)));
  auto gy = randn({4, 7, 12}, 9).to(at::kBFloat16);
  y.backward(gy);
  ASSERT_EQ(x.grad().scalar_type(), at::kBFloat16);
  ASSERT_EQ(w.grad().scalar_type(), at::kFloat);  // back in the master's type
  const auto gyf = gy.to(at::kFloat);
  EXPECT_TRUE(torch::equal(x.grad(), at::matmul(gyf, w16).to(at::kBFloat16)));
  EXPECT_TRUE(torch::equal(w.grad(), gyf.reshape({-1, 12}).t().mm(xf.reshape({-1, 16})).to(at::kBFloat16).to(at::kFloat)));
  EXPECT_TRUE(torch::equal(b.grad(), gyf.reshape({-1, 12}).sum(0).to(at::kBFloat16).to(at::kFloat)));
}

TEST(Precision, NativeAndWideningKernelsAgreeWithinBf16Rounding) {
  auto x = randn({8, 32, 64}, 12).to(at::kBFloat16);
  auto w = randn({48, 64}, 13);
  at::Tensor a, b;
  {
    KernelScope k(ProductKernel::kWiden);
    a = hp::precision::linear(x, w).to(at::kFloat);
  }
  {
    KernelScope k(ProductKernel::kNative);
    b = hp::precision::linear(x, w).to(at::kFloat);
  }
  const double err = (a - b).abs().max().item<double>() / a.abs().max().item<double>();
  EXPECT_LT(err, 2.0 / 256) << "max relative difference " << err;  // two bf16 units
}

TEST(Precision, BlockAttentionInBf16FollowsEagerAttentionInBf16) {
  KernelScope k(ProductKernel::kWiden);
  auto q = randn({2, 24, 3, 8}, 14).to(at::kBFloat16).requires_grad_(true);
  auto kk = randn({2, 24, 3, 8}, 15).to(at::kBFloat16).requires_grad_(true);
  auto v = randn({2, 24, 3, 8}, 16).to(at::kBFloat16).requires_grad_(true);
  auto eager = hp::causal_attention(q, kk, v);
  auto block = hp::block_causal_attention(q, kk, v, 7);
  ASSERT_EQ(eager.scalar_type(), at::kBFloat16);
  ASSERT_EQ(block.scalar_type(), at::kBFloat16);
  const auto e = eager.to(at::kFloat), bl = block.to(at::kFloat);
  EXPECT_LT((e - bl).abs().max().item<double>() / e.abs().max().item<double>(), 4.0 / 256);
  auto g = randn({2, 24, 24}, 17).to(at::kBFloat16);
  auto grads_of = [&](const at::Tensor& out) {
    return torch::autograd::grad({out}, {q, kk, v}, {g}, /*retain_graph=*/true);
  };
  auto ge = grads_of(eager), gb = grads_of(block);
  for (std::size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(gb[i].scalar_type(), at::kBFloat16);
    const auto a = ge[i].to(at::kFloat), b = gb[i].to(at::kFloat);
    EXPECT_LT((a - b).abs().max().item<double>() / a.abs().max().item<double>(), 4.0 / 256) << "input " << i;
  }
}

}  // namespace
