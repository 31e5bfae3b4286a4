#include <gtest/gtest.h>

#include <map>
#include <stdexcept>

#include <set>

#include "backends/dist/mesh.h"

using hp::dist::ProcessMesh;

TEST(ProcessMesh, TensorParallelIsFastestVarying) {
  ProcessMesh m(2, 2, 2);  // pp, dp, tp
  EXPECT_EQ(m.world_size(), 8);
  EXPECT_EQ(m.group_ranks("tp", 0), (std::vector<int>{0, 1}));
  EXPECT_EQ(m.group_ranks("dp", 0), (std::vector<int>{0, 2}));
  EXPECT_EQ(m.group_ranks("pp", 0), (std::vector<int>{0, 4}));
  EXPECT_EQ(m.group_ranks("pp", 3), (std::vector<int>{3, 7}));
  auto c = m.coord(6);
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(c.dp, 1);
  EXPECT_EQ(c.tp, 0);
  EXPECT_EQ(m.rank_of(1, 1, 0), 6);
}

TEST(ProcessMesh, EveryRankIsInExactlyOneGroupOfEachKind) {
  for (auto [pp, dp, tp, ep] : std::vector<std::array<int, 4>>{
           {1, 4, 1, 2}, {2, 2, 2, 1}, {1, 8, 1, 4}, {3, 2, 1, 2}, {1, 1, 1, 1}}) {
    ProcessMesh m(pp, dp, tp, ep);
    for (const auto& name : ProcessMesh::group_names()) {
      std::multiset<int> seen;
      for (const auto& g : m.all_groups(name)) seen.insert(g.begin(), g.end());
      EXPECT_EQ(static_cast<int>(seen.size()), m.world_size()) << name << " " << m.shape();
      for (int r = 0; r < m.world_size(); ++r) EXPECT_EQ(seen.count(r), 1u) << name << " " << r;
    }
  }
}

TEST(ProcessMesh, ExpertGroupsAreCarvedOutOfDataParallel) {
  ProcessMesh m(1, 4, 1, 2);
  EXPECT_EQ(m.group_ranks("ep", 0), (std::vector<int>{0, 1}));
  EXPECT_EQ(m.group_ranks("ep", 3), (std::vector<int>{2, 3}));
  EXPECT_EQ(m.group_ranks("edp", 0), (std::vector<int>{0, 2}));
  EXPECT_EQ(m.group_ranks("edp", 1), (std::vector<int>{1, 3}));
  EXPECT_EQ(m.edp_size(), 2);
}

TEST(ProcessMesh, ValidChecksEveryRule) {
  EXPECT_TRUE(ProcessMesh::valid(8, 2, 2, 2));
  EXPECT_FALSE(ProcessMesh::valid(8, 2, 2, 1));
  EXPECT_FALSE(ProcessMesh::valid(4, 1, 4, 1, 3));
  EXPECT_FALSE(ProcessMesh::valid(0, 0, 1, 1));
  EXPECT_THROW(ProcessMesh(1, 3, 1, 2), std::invalid_argument);
}

// A layout given by sizes (hp-ckpt's target layouts): missing dimensions
// are 1, and the group sizes and indices agree with the mesh's groups.
TEST(ProcessMesh, FromSizesAndGroupIndices) {
  const ProcessMesh m = ProcessMesh::from_sizes({{"tp", 2}, {"dp", 4}, {"ep", 2}});
  EXPECT_EQ(m.sizes(), (std::map<std::string, int>{{"pp", 1}, {"dp", 4}, {"tp", 2}, {"ep", 2}}));
  EXPECT_EQ(m.group_size("tp"), 2);
  EXPECT_EQ(m.group_size("edp"), 2);
  EXPECT_EQ(m.group_size("world"), 8);
  EXPECT_EQ(m.group_size("cp"), 0);
  for (int r = 0; r < m.world_size(); ++r) {
    const auto c = m.coord(r);
    EXPECT_EQ(m.group_index("tp", r), c.tp);
    EXPECT_EQ(m.group_index("dp", r), c.dp);
    EXPECT_EQ(m.group_index("ep", r), c.ep);
    EXPECT_EQ(m.group_index("edp", r), c.edp);
    EXPECT_EQ(m.group_index("pp", r), c.pp);
  }
  EXPECT_EQ(ProcessMesh::from_sizes({}).world_size(), 1);
  try {
    ProcessMesh::from_sizes({{"cp", 2}});
    FAIL() << "an unknown dimension must be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "unknown mesh dimension 'cp' (a layout is given by tp, dp, ep and pp)");
  }
  EXPECT_THROW(ProcessMesh::from_sizes({{"tp", 0}}), std::invalid_argument);
  EXPECT_THROW(ProcessMesh::from_sizes({{"dp", 2}, {"ep", 3}}), std::invalid_argument);
}

TEST(ProcessMesh, DescribeListsEveryRank) {
  ProcessMesh m(1, 2, 2);
  auto d = m.describe();
  EXPECT_NE(d.find("rank 3 -> pp 0, dp 1, tp 1, ep 0, edp 1 -> tp[2,3] dp[1,3] pp[3]"),
            std::string::npos) << d;
}

TEST(MeshPlan, SecondClaimIsAConflict) {
  hp::dist::MeshPlan p;
  p.claim("tp", 2, "tensor_parallel", hp::dist::MeshRole::kSplit);
  p.claim("tp", 4, "other", hp::dist::MeshRole::kSplit);
  ASSERT_EQ(p.conflicts.size(), 1u);
  EXPECT_EQ(p.size_of("tp"), 2);
  EXPECT_EQ(p.size_of("pp"), 1);
}

// A claim of a dimension the mesh does not serve is a problem, not dropped;
// so is a served dimension claimed with another role.
TEST(MeshPlan, UnservedDimensionAndWrongRoleAreRefused) {
  hp::dist::MeshPlan p;
  p.claim("cp", 2, "context_parallel", hp::dist::MeshRole::kSplit);
  p.claim("pp", 2, "odd_feature", hp::dist::MeshRole::kSplit);
  ASSERT_EQ(p.conflicts.size(), 2u);
  EXPECT_EQ(p.conflicts[0],
            "mesh dimension 'cp' claimed by 'context_parallel' is not served by the process mesh, so nothing would "
            "act on it (served: ep (split), pp (partition), tp (split))");
  EXPECT_EQ(p.conflicts[1], "mesh dimension 'pp' claimed by 'odd_feature' with role split, but the mesh serves it only "
                            "as partition");
  EXPECT_EQ(p.size_of("cp"), 1);
  EXPECT_EQ(p.size_of("pp"), 1);
}

TEST(ProcessMesh, RolesNameTheirGroupsAndLeaders) {
  ProcessMesh m(2, 2, 2);
  EXPECT_EQ(ProcessMesh::role_group(hp::dist::MeshRole::kPartition), "pp");
  EXPECT_EQ(ProcessMesh::role_group(hp::dist::MeshRole::kReplicate), "dp");
  EXPECT_EQ(m.leaders(), (std::vector<int>{0, 4}));
  EXPECT_TRUE(m.is_leader(4));
  EXPECT_FALSE(m.is_leader(5));
  EXPECT_EQ(m.replicas(), 2);
  EXPECT_EQ(m.replica_rank(6), 1);
  hp::dist::MeshPlan plan;
  plan.claim("pp", 2, "pipeline_parallel", hp::dist::MeshRole::kPartition);
  ProcessMesh resolved;
  hp::dist::MeshProblem problem;
  ASSERT_TRUE(hp::dist::resolve_mesh(plan, 8, 0, resolved, problem));
  EXPECT_EQ(plan.replicas, 4);
  EXPECT_EQ(resolved.shape(), "pp=2 dp=4 tp=1 ep=1");
  EXPECT_FALSE(hp::dist::resolve_mesh(plan, 7, 0, resolved, problem));
  EXPECT_EQ(problem.key, "distributed");
}
