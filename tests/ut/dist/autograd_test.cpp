// Autograd-aware collectives: forward values and gradients against a dense
// computation of the same total loss, on 2 and 4 ranks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hp/comm/autograd.h"
#include "hp/comm/group.h"
#include "tests/support/multi_rank.h"

using hp::dist::DistributedContext;

namespace {
torch::Tensor seeded(int seed, std::vector<int64_t> shape) {
  auto g = torch::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randn(shape, g);
}
bool close(const torch::Tensor& a, const torch::Tensor& b) {
  return torch::allclose(a, b, 1e-5, 1e-6);
}
class AutogradOps : public ::testing::TestWithParam<int> {};
}  // namespace

TEST_P(AutogradOps, CopyToGroupSumsGradients) {
  const int n = GetParam();
  hp::test::run_ranks(n, [&](DistributedContext& ctx) {
    auto x = seeded(1, {3, 4}).requires_grad_(true);
    auto y = hp::dist::copy_to_group(x, ctx.group("world"));
    EXPECT_TRUE(torch::equal(y, x));
    (y * seeded(100 + ctx.rank(), {3, 4})).sum().backward();
    auto expect = torch::zeros({3, 4});
    for (int r = 0; r < n; ++r) expect += seeded(100 + r, {3, 4});
    EXPECT_TRUE(close(x.grad(), expect));
  });
}

TEST_P(AutogradOps, ReduceFromGroupPassesGradientThrough) {
  const int n = GetParam();
  hp::test::run_ranks(n, [&](DistributedContext& ctx) {
    auto x = seeded(10 + ctx.rank(), {5}).requires_grad_(true);
    auto y = hp::dist::reduce_from_group(x, ctx.group("world"));
    auto sum = torch::zeros({5});
    for (int r = 0; r < n; ++r) sum += seeded(10 + r, {5});
    EXPECT_TRUE(close(y, sum));
    auto w = seeded(7, {5});
    (y * w).sum().backward();
    EXPECT_TRUE(close(x.grad(), w));
  });
}

TEST_P(AutogradOps, ScatterAndGatherAreMirrors) {
  const int n = GetParam();
  hp::test::run_ranks(n, [&](DistributedContext& ctx) {
    auto& g = ctx.group("world");
    const int me = ctx.rank();
    // scatter: loss = sum_r <chunk_r(x), w_r>; dense gradient is w (all chunks).
    auto x = seeded(3, {2, 2 * n}).requires_grad_(true);
    auto y = hp::dist::scatter_to_group(x, g, 1);
    EXPECT_TRUE(torch::equal(y, x.detach().chunk(n, 1)[me]));
    auto w = seeded(4, {2, 2 * n});
    (y * w.chunk(n, 1)[me]).sum().backward();
    EXPECT_TRUE(close(x.grad(), w));
    // gather: y = cat(x_r), loss = <y, W> on every rank (replicated); each
    // x_r's gradient is its chunk of W.
    auto full = seeded(5, {2 * n, 3});
    auto xr = full.chunk(n, 0)[me].clone().requires_grad_(true);
    auto z = hp::dist::gather_from_group(xr, g, 0);
    EXPECT_TRUE(torch::equal(z, full));
    auto W = seeded(6, {2 * n, 3});
    (z * W).sum().backward();
    EXPECT_TRUE(close(xr.grad(), W.chunk(n, 0)[me]));
  });
}

TEST_P(AutogradOps, SequenceParallelPairIsExact) {
  const int n = GetParam();
  hp::test::run_ranks(n, [&](DistributedContext& ctx) {
    auto& g = ctx.group("world");
    const int me = ctx.rank();
    // reduce-scatter: y_r = chunk_r(sum_s x_s); loss = sum_r <y_r, W_r>.
    // d loss / d x_s = cat_r W_r for every s.
    auto x = seeded(20 + me, {2 * n, 3}).requires_grad_(true);
    auto y = hp::dist::reduce_scatter_to_group(x, g, 0);
    auto total = torch::zeros({2 * n, 3});
    for (int r = 0; r < n; ++r) total += seeded(20 + r, {2 * n, 3});
    EXPECT_TRUE(close(y, total.chunk(n, 0)[me]));
    std::vector<torch::Tensor> ws;
    for (int r = 0; r < n; ++r) ws.push_back(seeded(40 + r, {2, 3}));
    (y * ws[me]).sum().backward();
    EXPECT_TRUE(close(x.grad(), torch::cat(ws, 0)));
    // all-gather: y = cat_s x_s on every rank; loss = sum_r <y, V_r>.
    // d loss / d x_s = chunk_s(sum_r V_r).
    auto xs = seeded(60 + me, {2, 3}).requires_grad_(true);
    auto yg = hp::dist::all_gather_from_group(xs, g, 0);
    auto vsum = torch::zeros({2 * n, 3});
    for (int r = 0; r < n; ++r) vsum += seeded(80 + r, {2 * n, 3});
    (yg * seeded(80 + me, {2 * n, 3})).sum().backward();
    EXPECT_TRUE(close(xs.grad(), vsum.chunk(n, 0)[me]));
  });
}

TEST_P(AutogradOps, UnevenAllToAllRoutesGradientsBack) {
  const int n = GetParam();
  auto count = [](int r, int j) -> int64_t { return (r + 2 * j) % 3 + 1; };
  hp::test::run_ranks(n, [&](DistributedContext& ctx) {
    const int me = ctx.rank();
    std::vector<int64_t> send, recv;
    int64_t rows_in = 0, rows_out = 0;
    for (int j = 0; j < n; ++j) {
      send.push_back(count(me, j));
      recv.push_back(count(j, me));
      rows_in += count(me, j);
      rows_out += count(j, me);
    }
    auto x = seeded(200 + me, {rows_in, 2}).requires_grad_(true);
    auto y = hp::dist::all_to_all(x, ctx.group("world"), send, recv);
    ASSERT_EQ(y.size(0), rows_out);
    (y * seeded(300 + me, {rows_out, 2})).sum().backward();
    // Row block of x sent to j received gradient from U_j at the offset where
    // j placed rows from `me`.
    int64_t at = 0;
    for (int j = 0; j < n; ++j) {
      int64_t rows_j = 0, off = 0;
      for (int s = 0; s < n; ++s) {
        if (s == me) off = rows_j;
        rows_j += count(s, j);
      }
      auto U = seeded(300 + j, {rows_j, 2});
      EXPECT_TRUE(close(x.grad().narrow(0, at, count(me, j)), U.narrow(0, off, count(me, j))))
          << "block to rank " << j;
      at += count(me, j);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, AutogradOps, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });
