// include/hp/comm/placement.h: the one cut of a global tensor into the part a
// member of a placement holds, and its inverse. For every placement kind at
// 1 to 4 parts on every tensor dimension, even and uneven, and for nested
// placements (a tensor-parallel slice cut again by zero, two dimensions
// sharded at once, a shard inside a head-tail), placing every member's cut
// back is bitwise the identity and the members' parts tile the tensor once.
#include "hp/comm/placement.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hp/comm/mesh.h"

namespace {

using hp::dist::MeshCoord;
using hp::dist::Placement;
using hp::dist::Placements;

/// Every member's coordinates for `sizes` (one per placement), the last
/// varying fastest.
std::vector<std::vector<MeshCoord>> members(const std::vector<int>& sizes) {
  std::vector<std::vector<MeshCoord>> out{{}};
  for (int n : sizes) {
    std::vector<std::vector<MeshCoord>> next;
    for (const auto& c : out) {
      for (int i = 0; i < n; ++i) {
        auto d = c;
        d.push_back({n, i});
        next.push_back(d);
      }
    }
    out = next;
  }
  return out;
}

/// Cuts `full` for every member, places every part (one per replica) back into zeros and
/// checks the result is `full` bitwise and (without partial) every element
/// was written exactly once.
void round_trip(const torch::Tensor& full, const Placements& p, const std::vector<int>& sizes) {
  const auto what = hp::dist::describe(p) + " at sizes " + ::testing::PrintToString(sizes) + " of " +
                    ::testing::PrintToString(full.sizes().vec());
  auto back = torch::zeros_like(full);
  auto count = torch::zeros_like(full);
  bool partial = false;
  for (const auto& c : members(sizes)) {
    // Replicas hold the same part: one of them assembles it.
    bool replica = false;
    for (std::size_t i = 0; i < p.size(); ++i) {
      replica = replica || (p[i].placement.kind == Placement::Kind::kReplicate && c[i].index != 0);
    }
    if (replica) continue;
    const auto part = hp::dist::part_of(full.sizes().vec(), p, c);
    const auto local = hp::dist::cut(full, part);
    ASSERT_EQ(local.sizes().vec(), part.local_shape()) << what;
    hp::dist::place(back, local, part);
    hp::dist::place(count, torch::ones_like(local), part);
    partial = partial || part.partial;
  }
  EXPECT_TRUE(torch::equal(back, full)) << what;
  if (!partial) EXPECT_TRUE(torch::equal(count, torch::ones_like(full))) << what << ": not tiled exactly once";
}

TEST(Placement, EveryKindAtOneToFourPartsOnEveryDimensionIsTheIdentity) {
  auto gen = torch::make_generator<at::CPUGeneratorImpl>(11);
  const auto full = torch::randn({5, 8, 3}, gen);  // 5 and 3 uneven for most counts, 8 even
  for (int dim = 0; dim < 3; ++dim) {
    for (int n = 1; n <= 4; ++n) {
      for (auto pl : {Placement::shard(dim), Placement::head_tail(dim), Placement::replicate(), Placement::partial()}) {
        round_trip(full, {{"x", pl}}, {n});
      }
    }
  }
}

TEST(Placement, NestedPlacementsAreTheIdentity) {
  auto gen = torch::make_generator<at::CPUGeneratorImpl>(12);
  const auto full = torch::randn({7, 6}, gen);
  for (int a = 1; a <= 4; ++a) {
    for (int b = 1; b <= 4; ++b) {
      // A tensor-parallel slice cut again by zero, along the same dimension.
      round_trip(full, {{"tp", Placement::shard(0)}, {"dp", Placement::shard(0)}}, {a, b});
      // Two tensor dimensions at once.
      round_trip(full, {{"tp", Placement::shard(1)}, {"dp", Placement::shard(0)}}, {a, b});
      // A shard inside a head-tail along the same dimension and across.
      round_trip(full, {{"cp", Placement::head_tail(0)}, {"dp", Placement::shard(0)}}, {a, b});
      round_trip(full, {{"cp", Placement::head_tail(0)}, {"tp", Placement::shard(1)}}, {a, b});
      // Replicated over one dimension, partial over another.
      round_trip(full, {{"dp", Placement::replicate()}, {"tp", Placement::partial()}}, {a, b});
    }
  }
}

TEST(Placement, HeadTailHoldsChunksRAndTwoNMinusOneMinusR) {
  // 8 positions over 2 members: chunks of 2; member 0 holds 0 and 3, member 1 holds 1 and 2.
  const auto seq = torch::arange(8).view({1, 8});
  const Placements p{{"cp", Placement::head_tail(1)}};
  EXPECT_TRUE(torch::equal(hp::dist::cut(seq, hp::dist::part_of({1, 8}, p, {{2, 0}})),
                           torch::tensor({0, 1, 6, 7}).view({1, 4})));
  EXPECT_TRUE(torch::equal(hp::dist::cut(seq, hp::dist::part_of({1, 8}, p, {{2, 1}})),
                           torch::tensor({2, 3, 4, 5}).view({1, 4})));
}

TEST(Placement, AZeroSliceOfATensorParallelSliceIsTheNestedRange) {
  // 10 rows over tp=3 (4, 3, 3), then the middle slice over dp=2 (2, 1).
  const Placements p{{"tp", Placement::shard(0)}, {"dp", Placement::shard(0)}};
  const auto part = hp::dist::part_of({10, 2}, p, {{3, 1}, {2, 1}});
  ASSERT_EQ(part.boxes.size(), 1u);
  EXPECT_EQ(part.boxes[0].offsets, (std::vector<int64_t>{6, 0}));
  EXPECT_EQ(part.boxes[0].lengths, (std::vector<int64_t>{1, 2}));
}

TEST(Placement, TextRoundTripsAndBadInputIsRefused) {
  for (auto pl : {Placement::shard(0), Placement::shard(12), Placement::head_tail(1), Placement::replicate(),
                  Placement::partial()}) {
    Placement back;
    ASSERT_TRUE(Placement::parse(pl.str(), back)) << pl.str();
    EXPECT_EQ(back, pl);
  }
  Placement out;
  for (const char* bad : {"", "S", "S()", "S(-1)", "S(1", "X(0)", "s(0)", "S(1000)"}) {
    EXPECT_FALSE(Placement::parse(bad, out)) << bad;
  }
  EXPECT_EQ(hp::dist::describe({{"tp", Placement::shard(0)}, {"dp", Placement::shard(0)}}), "tp:S(0) dp:S(0)");
  EXPECT_EQ(hp::dist::describe({}), "replicated");
  EXPECT_THROW(hp::dist::part_of({4}, {{"tp", Placement::shard(1)}}, {{2, 0}}), std::invalid_argument);
  EXPECT_THROW(hp::dist::part_of({4, 4}, {{"a", Placement::head_tail(0)}, {"b", Placement::head_tail(1)}},
                                 {{2, 0}, {2, 0}}),
               std::invalid_argument);
}

TEST(Placement, CoordinatesComeFromTheMesh) {
  hp::dist::MeshPlan plan;
  plan.claim("tp", 2, "t", hp::dist::MeshRole::kSplit);
  hp::dist::ProcessMesh mesh;
  hp::dist::MeshProblem problem;
  ASSERT_TRUE(hp::dist::resolve_mesh(plan, 4, 0, mesh, problem));
  const Placements p{{"tp", Placement::shard(0)}, {"dp", Placement::shard(0)}};
  for (int r = 0; r < 4; ++r) {
    const auto c = hp::dist::coords_of(mesh, p, r);
    ASSERT_EQ(c.size(), 2u);
    EXPECT_EQ(c[0].size, 2);
    EXPECT_EQ(c[0].index, mesh.group_index("tp", r));
    EXPECT_EQ(c[1].index, mesh.group_index("dp", r));
  }
  try {
    hp::dist::coords_of(mesh, {{"cp", Placement::shard(0)}}, 0);
    ADD_FAILURE() << "a placement over a dimension the mesh lacks was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("names mesh dimension 'cp', which this mesh"), std::string::npos) << e.what();
  }
}

}  // namespace
