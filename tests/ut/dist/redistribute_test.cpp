// include/hp/comm/redistribute.h on real Gloo groups (one thread per rank):
// every pair of placements (replicate, partial, shard along either tensor
// dimension) over meshes of one, two and three dimensions, on a tensor
// whose dimensions the members split unevenly. The partial sums are of
// small integers, so every sum is exact in any order and the results are
// checked bitwise. Also: dimensions that change alike run as one collective
// over the mesh's flat group, a bucket of differently shaped tensors moves
// in one collective per step, the reduction type is honoured, and changes
// nothing makes are refused.
#include "hp/comm/redistribute.h"

#include <gtest/gtest.h>

#include <iostream>
#include <torch/torch.h>

#include "hp/comm/context.h"
#include "hp/comm/mesh.h"
#include "tests/support/multi_rank.h"

namespace {

using hp::dist::CommOp;
using hp::dist::DistributedContext;
using hp::dist::MeshDim;
using hp::dist::MeshRole;
using hp::dist::Placement;
using hp::dist::Placements;
using hp::dist::ProcessMesh;

const std::vector<std::int64_t> kShape{5, 7};

torch::Tensor global_value() { return torch::arange(35, torch::kFloat).reshape({5, 7}) - 11; }
/// The part a partial dimension's members add and take away again.
torch::Tensor noise(std::size_t d) {
  return (torch::arange(35, torch::kFloat).reshape({5, 7}) * static_cast<double>(3 + 2 * d)).remainder(13) - 6;
}

/// Rank `rank`'s part under `pl` of the global value split into partial
/// sums over `pl`'s partial dimensions: the member at index 0 of every
/// partial dimension holds the value, and each partial dimension adds
/// noise(d) times -(n-1) at index 0 and 1 elsewhere (summing to zero), at
/// index 0 of the other partial dimensions. Summing over any of them gives
/// the same form over the rest. Only the dimensions in `noisy` add noise:
/// a partial the redistribution made from a replica (R -> P) is the value
/// at index 0 and zeros elsewhere.
torch::Tensor part(const ProcessMesh& mesh, const Placements& pl, int rank, const Placements& noisy) {
  const auto coords = hp::dist::coords_of(mesh, pl, rank);
  const auto p = hp::dist::part_of(kShape, pl, coords);
  auto box = [&](const torch::Tensor& t) { return hp::dist::slice_of(t, p.boxes.at(0)).clone(); };
  std::vector<std::size_t> partial;
  for (std::size_t i = 0; i < pl.size(); ++i)
    if (pl[i].placement.kind == Placement::Kind::kPartial && coords[i].size > 1) partial.push_back(i);
  auto all_zero_but = [&](std::size_t skip) {
    for (std::size_t i : partial)
      if (i != skip && coords[i].index != 0) return false;
    return true;
  };
  torch::Tensor out = all_zero_but(pl.size()) ? box(global_value()) : torch::zeros_like(box(global_value()));
  auto is_noisy = [&](const std::string& dim) {
    for (const auto& n : noisy)
      if (n.dim == dim && n.placement.kind == Placement::Kind::kPartial) return true;
    return false;
  };
  for (std::size_t d : partial) {
    if (!all_zero_but(d) || !is_noisy(pl[d].dim)) continue;
    const double c = coords[d].index == 0 ? -(coords[d].size - 1) : 1.0;
    out += box(noise(d)) * c;
  }
  return out;
}

std::vector<Placement> kinds() {
  return {Placement::replicate(), Placement::partial(), Placement::shard(0), Placement::shard(1)};
}

/// Every list of one placement per dimension of `dims`.
std::vector<Placements> all_layouts(const std::vector<std::string>& dims) {
  std::vector<Placements> out{{}};
  for (const auto& d : dims) {
    std::vector<Placements> next;
    for (const auto& l : out) {
      for (const auto& k : kinds()) {
        auto m = l;
        m.push_back({d, k});
        next.push_back(m);
      }
    }
    out = next;
  }
  return out;
}

bool shard_to_partial(const Placements& from, const Placements& to) {
  for (std::size_t i = 0; i < from.size(); ++i)
    if (from[i].placement.shards() && to[i].placement.kind == Placement::Kind::kPartial) return true;
  return false;
}

/// Two dimensions whose shards (before or after) cut the same tensor
/// dimension: the only pairs the planner may refuse (no order of steps
/// nests the shards).
bool renests(const Placements& from, const Placements& to) {
  for (std::size_t j = 0; j < from.size(); ++j) {
    for (std::size_t i = 0; i < j; ++i) {
      for (const auto& a : {from[i].placement, to[i].placement})
        for (const auto& b : {from[j].placement, to[j].placement})
          if (a.shards() && b.shards() && a.dim == b.dim) return true;
    }
  }
  return false;
}

/// Runs every pair on every rank; counts the pairs checked.
void every_pair(const ProcessMesh& mesh, const std::vector<std::string>& dims, int stride = 1) {
  const auto layouts = all_layouts(dims);
  hp::test::run_ranks(
      mesh,
      [&](DistributedContext& ctx) {
        int k = 0, checked = 0, refused = 0;
        for (const auto& from : layouts) {
          for (const auto& to : layouts) {
            if (k++ % stride != 0) continue;
            const std::string what = hp::dist::describe(from) + " -> " + hp::dist::describe(to);
            if (shard_to_partial(from, to)) {
              EXPECT_THROW(hp::dist::plan_redistribute(ctx.mesh(), from, to), std::invalid_argument) << what;
              continue;
            }
            // The plan depends on the placements and the mesh only, so every
            // rank refuses the same pairs (none waits in a collective).
            try {
              hp::dist::plan_redistribute(ctx.mesh(), from, to);
            } catch (const std::invalid_argument& e) {
              EXPECT_TRUE(renests(from, to)) << what << " refused: " << e.what();
              ++refused;
              continue;
            }
            torch::Tensor got;
            try {
              got = hp::dist::redistribute(ctx, part(ctx.mesh(), from, ctx.rank(), from), kShape, from, to);
            } catch (const std::exception& e) {
              ADD_FAILURE() << what << " on rank " << ctx.rank() << ": " << e.what();  // then the others time out
              throw;
            }
            const torch::Tensor want = part(ctx.mesh(), to, ctx.rank(), from);
            // EXPECT, not ASSERT: every rank goes on to the next pair's collectives.
            EXPECT_TRUE(got.sizes() == want.sizes() && torch::equal(got, want))
                << what << " on rank " << ctx.rank() << ": " << got << " against " << want;
            ++checked;
          }
        }
        // Most pairs are moves a step makes.
        EXPECT_GT(checked, 4 * refused);
        if (ctx.rank() == 0) std::cout << checked << " pairs moved, " << refused << " refused\n";
      },
      std::chrono::seconds(60));
}

TEST(Redistribute, EveryPairOverOneDimensionOfThree) {
  every_pair(ProcessMesh({MeshDim{"x", 3, MeshRole::kReplicate}}), {"x"});
}

TEST(Redistribute, EveryPairOverTwoDimensions) {
  // Both data dimensions: the mesh joins them (x_y), so sums over both run once.
  every_pair(ProcessMesh({MeshDim{"x", 2, MeshRole::kReplicate}, MeshDim{"y", 2, MeshRole::kSequence}}), {"x", "y"});
  every_pair(ProcessMesh({MeshDim{"x", 2, MeshRole::kSplit}, MeshDim{"y", 2, MeshRole::kReplicate}}), {"y", "x"});
}

TEST(Redistribute, EveryPairOverThreeDimensions) {
  // 64 x 64 pairs on 8 ranks.
  every_pair(ProcessMesh({MeshDim{"x", 2, MeshRole::kSplit}, MeshDim{"y", 2, MeshRole::kReplicate},
                          MeshDim{"z", 2, MeshRole::kReplicate}}),
             {"z", "x", "y"});
}

TEST(Redistribute, DimensionsChangingAlikeRunAsOneCollectiveOverTheirFlatGroup) {
  const ProcessMesh mesh({MeshDim{"tp", 2, MeshRole::kSplit}, MeshDim{"cp", 2, MeshRole::kSequence},
                          MeshDim{"dp", 2, MeshRole::kReplicate}});
  const Placements grad{{"tp", Placement::shard(0)}, {"cp", Placement::partial()}, {"dp", Placement::partial()}};
  const Placements param{{"tp", Placement::shard(0)}};
  auto steps = hp::dist::plan_redistribute(mesh, grad, param);
  ASSERT_EQ(steps.size(), 1u) << hp::dist::describe(steps);
  EXPECT_EQ(steps[0].op, CommOp::kAllReduce);
  EXPECT_EQ(steps[0].group, "cp_dp");
  // A zero slice over both: one reduce-scatter over the same group.
  const Placements slice{{"tp", Placement::shard(0)}, {"dp", Placement::shard(1)}, {"cp", Placement::shard(1)}};
  steps = hp::dist::plan_redistribute(mesh, grad, slice);
  ASSERT_EQ(steps.size(), 1u) << hp::dist::describe(steps);
  EXPECT_EQ(steps[0].op, CommOp::kReduceScatter);
  // Sequence parallel's replicated parameters: tp first (no group joins tp
  // with the data dimensions), then cp x dp at once.
  const Placements sp{{"tp", Placement::partial()}, {"cp", Placement::partial()}, {"dp", Placement::partial()}};
  steps = hp::dist::plan_redistribute(mesh, sp, {});
  ASSERT_EQ(steps.size(), 2u) << hp::dist::describe(steps);
  EXPECT_EQ(steps[0].group, "tp");
  EXPECT_EQ(steps[1].group, "cp_dp");
  EXPECT_EQ(hp::dist::describe(steps), "all_reduce over tp, all_reduce over cp_dp (cp x dp)");
  // Dimensions of size 1 take no part.
  const ProcessMesh narrow({MeshDim{"tp", 1, MeshRole::kSplit}, MeshDim{"dp", 2, MeshRole::kReplicate}});
  EXPECT_TRUE(hp::dist::plan_redistribute(narrow, {{"tp", Placement::partial()}}, {}).empty());
}

TEST(Redistribute, ChangesNothingMakesAreRefused) {
  const ProcessMesh mesh({MeshDim{"x", 2, MeshRole::kReplicate}});
  EXPECT_THROW(hp::dist::plan_redistribute(mesh, {{"x", Placement::shard(0)}}, {{"x", Placement::partial()}}),
               std::invalid_argument);
  EXPECT_THROW(hp::dist::plan_redistribute(mesh, {{"x", Placement::head_tail(0)}}, {}), std::invalid_argument);
  EXPECT_THROW(hp::dist::plan_redistribute(mesh, {{"w", Placement::partial()}}, {}), std::invalid_argument);
}

TEST(Redistribute, ABucketOfTensorsMovesInOneCollectivePerStepInTheReductionType) {
  const ProcessMesh mesh({MeshDim{"tp", 2, MeshRole::kSplit}, MeshDim{"dp", 2, MeshRole::kReplicate}});
  hp::test::run_ranks(mesh, [](DistributedContext& ctx) {
    const int tp = ctx.mesh().group_index("tp", ctx.rank()), dp = ctx.mesh().group_index("dp", ctx.rank());
    // A tp-sharded matrix and a replicated vector, both partial over dp, to
    // zero slices along different tensor dimensions.
    std::vector<hp::dist::RedistributeItem> items{
        {{4, 6}, {{"tp", Placement::shard(0)}, {"dp", Placement::partial()}},
         {{"tp", Placement::shard(0)}, {"dp", Placement::shard(1)}}},
        {{5}, {{"dp", Placement::partial()}}, {{"dp", Placement::shard(0)}}}};
    hp::dist::Redistributor r(ctx, items);
    ASSERT_EQ(r.steps().size(), 1u);
    EXPECT_EQ(r.steps()[0].op, CommOp::kReduceScatter);
    EXPECT_EQ(r.result_shape(0), (std::vector<std::int64_t>{2, 3}));
    EXPECT_EQ(r.result_shape(1), (std::vector<std::int64_t>{dp == 0 ? 3 : 2}));
    // bf16 parts summed in float (Gloo in LibTorch 1.13 has no bf16 sum):
    // the result is bf16 again.
    hp::dist::RedistributeOptions o;
    o.reduce_dtype = torch::kFloat;
    hp::dist::Redistributor r16(ctx, items, o);
    auto m16 = (torch::arange(12, torch::kFloat).reshape({2, 6}) + 10 * dp).to(torch::kBFloat16);
    auto b16 = torch::full({5}, 1.0 + dp, torch::kBFloat16);
    const auto out = r16.run({m16, b16});
    EXPECT_EQ(out[0].scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::equal(out[0].to(torch::kFloat),
                             (torch::arange(12, torch::kFloat).reshape({2, 6}) * 2 + 10).narrow(1, dp * 3, 3)));
    EXPECT_TRUE(torch::equal(out[1].to(torch::kFloat), torch::full({dp == 0 ? 3 : 2}, 3.0)));
    // Integer parts, exact: the matrix's slice is (tp, dp)'s box of the sum.
    auto mi = torch::arange(12, torch::kFloat).reshape({2, 6}) + 100 * tp + 1000 * dp;
    auto bi = torch::arange(5, torch::kFloat) * (dp + 1);
    const auto got = r.run({mi, bi});
    auto sum = torch::arange(12, torch::kFloat).reshape({2, 6}) * 2 + 200 * tp + 1000;
    EXPECT_TRUE(torch::equal(got[0], sum.narrow(1, dp * 3, 3)));
    EXPECT_TRUE(torch::equal(got[1], (torch::arange(5, torch::kFloat) * 3).narrow(0, dp == 0 ? 0 : 3, dp == 0 ? 3 : 2)));
  });
}

}  // namespace
