#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <stdexcept>

#include "hp/comm/mesh.h"
#include "tools/hp_ckpt/layout.h"

using hp::dist::MeshPlan;
using hp::dist::MeshProblem;
using hp::dist::MeshRole;
using hp::dist::ProcessMesh;

namespace {

ProcessMesh grid(int pp, int dp, int tp, int ep = 1) {
  return hp::ckpt_tool::layout_mesh({{"pp", pp}, {"dp", dp}, {"tp", tp}, {"ep", ep}});
}

ProcessMesh resolved(MeshPlan plan, int world, int dp = 0) {
  ProcessMesh m;
  MeshProblem problem;
  if (!hp::dist::resolve_mesh(plan, world, dp, m, problem)) {
    throw std::invalid_argument(problem.key + " = " + problem.value + ": " + problem.rule);
  }
  return m;
}

// Every rank is in exactly one group of each kind, each group has the kind's
// size, and a group's members agree on every base coordinate the group does
// not vary (checked through tag(), which prints the base coordinates).
void expect_partition(const ProcessMesh& m) {
  for (const auto& name : m.group_names()) {
    std::multiset<int> seen;
    for (const auto& g : m.all_groups(name)) {
      EXPECT_EQ(static_cast<int>(g.size()), m.group_size(name)) << name << " " << m.shape();
      EXPECT_TRUE(std::is_sorted(g.begin(), g.end())) << name;
      seen.insert(g.begin(), g.end());
      for (int r : g) EXPECT_EQ(m.group_ranks(name, r), g) << name << " rank " << r;
    }
    for (int r = 0; r < m.world_size(); ++r) EXPECT_EQ(seen.count(r), 1u) << name << " rank " << r << " " << m.shape();
  }
}

}  // namespace

// The layout of the shipped features is the one of the fixed grid it
// replaces: rank = (pp * dp_size + dp) * tp_size + tp, ep = dp % ep_size,
// edp = dp / ep_size; checked for every layout of 1 to 8 ranks.
TEST(ProcessMesh, ShippedLayoutMatchesTheGridFormulaAtWorldSizes1To8) {
  int layouts = 0;
  for (int pp = 1; pp <= 8; ++pp)
    for (int dp = 1; pp * dp <= 8; ++dp)
      for (int tp = 1; pp * dp * tp <= 8; ++tp)
        for (int ep = 1; ep <= dp; ++ep) {
          if (dp % ep) continue;
          const ProcessMesh m = grid(pp, dp, tp, ep);
          ++layouts;
          ASSERT_EQ(m.world_size(), pp * dp * tp);
          EXPECT_EQ(m.order(), "tp-dp-pp");
          auto rank_of = [&](int p, int d, int t) { return (p * dp + d) * tp + t; };
          for (int r = 0; r < m.world_size(); ++r) {
            const int t = r % tp, d = (r / tp) % dp, p = r / (tp * dp), e = d % ep, ed = d / ep;
            std::vector<int> tpg, dpg, ppg, epg, edpg;
            for (int i = 0; i < tp; ++i) tpg.push_back(rank_of(p, d, i));
            for (int i = 0; i < dp; ++i) dpg.push_back(rank_of(p, i, t));
            for (int i = 0; i < pp; ++i) ppg.push_back(rank_of(i, d, t));
            for (int i = 0; i < ep; ++i) epg.push_back(rank_of(p, ed * ep + i, t));
            for (int i = 0; i < dp / ep; ++i) edpg.push_back(rank_of(p, i * ep + e, t));
            EXPECT_EQ(m.group_ranks("tp", r), tpg);
            EXPECT_EQ(m.group_ranks("dp", r), dpg);
            EXPECT_EQ(m.group_ranks("pp", r), ppg);
            EXPECT_EQ(m.group_ranks("ep", r), epg);
            EXPECT_EQ(m.group_ranks("edp", r), edpg);
            EXPECT_EQ(m.group_index("ep", r), e);
            EXPECT_EQ(m.group_index("edp", r), ed);
            EXPECT_EQ(m.replica_rank(r), d);
            EXPECT_EQ(m.is_leader(r), d == 0 && t == 0);
          }
          expect_partition(m);
        }
  EXPECT_GT(layouts, 40);
}

// Every order string of three claimed dimensions and the data dimension,
// at every size product up to 8: groups partition the ranks, and the
// innermost dimension is the fastest-varying.
TEST(ProcessMesh, EveryOrderStringPartitionsTheRanks) {
  std::vector<std::string> names{"a", "b", "pp", "dp"};
  std::sort(names.begin(), names.end());
  int meshes = 0;
  do {
    const std::string order = names[0] + "-" + names[1] + "-" + names[2] + "-" + names[3];
    for (int a = 1; a <= 2; ++a)
      for (int b = 1; b <= 2; ++b)
        for (int p = 1; p <= 2; ++p)
          for (int d = 1; a * b * p * d <= 8; ++d) {
            MeshPlan plan;
            plan.claim("a", a, "fa", MeshRole::kSplit);
            plan.claim("b", b, "fb", MeshRole::kSequence);
            plan.claim("pp", p, "fp", MeshRole::kPartition);
            plan.order = order;
            const ProcessMesh m = resolved(plan, a * b * p * d);
            ++meshes;
            EXPECT_EQ(m.order(), order);
            expect_partition(m);
            const auto& inner = m.dims().front();
            std::vector<int> first;
            for (int i = 0; i < inner.size; ++i) first.push_back(i);
            EXPECT_EQ(m.group_ranks(inner.name, 0), first) << order;
          }
  } while (std::next_permutation(names.begin(), names.end()));
  EXPECT_EQ(meshes, 24 * 27);
}

// The shape context parallel needs: a dimension that splits the sequence
// while parameters are replicated over it. Gradients are summed over it and
// over dp (data_dims), samples are split over dp only (replicas), and by
// role it sits between the split and the replicate dimensions (as
// Megatron's tp-cp-ep-dp-pp).
TEST(ProcessMesh, SequenceDimensionReplicatesParametersButNotSamples) {
  MeshPlan plan;
  plan.claim("tp", 2, "tensor_parallel", MeshRole::kSplit);
  plan.claim("cp", 2, "context_parallel", MeshRole::kSequence);
  plan.claim("pp", 2, "pipeline_parallel", MeshRole::kPartition);
  const ProcessMesh m = resolved(plan, 16);
  EXPECT_EQ(m.order(), "tp-cp-dp-pp");
  EXPECT_EQ(m.data_dims(), (std::vector<std::string>{"cp", "dp"}));
  EXPECT_EQ(m.replicas(), 2);
  EXPECT_EQ(m.group_ranks("cp", 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(m.replica_rank(5), 1);
  EXPECT_EQ(m.replica_rank(9), 0);
  EXPECT_EQ(m.replica_rank(7), m.replica_rank(5)) << "cp ranks read the same samples";
  EXPECT_EQ(m.leaders(), (std::vector<int>{0, 8}));
  expect_partition(m);
}

// Per-module degrees: two tensor-parallel views of different sizes over the
// same ranks. Attention sees tp=2 x dp=4; the FFN view refactors tp x dp
// into ffn_tp=4 x ffn_dp=2; the experts' view refactors dp into ep x edp.
TEST(ProcessMesh, TwoTensorParallelViewsOfDifferentSizesOnTheSameRanks) {
  MeshPlan plan;
  plan.claim("tp", 2, "tensor_parallel", MeshRole::kSplit);
  plan.view({"ffn", {"tp", "dp"}, {{"ffn_tp", 4, MeshRole::kSplit, "t"}, {"ffn_dp", 0, MeshRole::kReplicate, "t"}}, "t"});
  plan.carve("ep", 2, "expert_parallel", MeshRole::kSplit);
  const ProcessMesh m = resolved(plan, 8);
  EXPECT_EQ(m.group_size("ffn_dp"), 2);
  EXPECT_EQ(m.group_ranks("tp", 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(m.group_ranks("ffn_tp", 5), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(m.group_ranks("ffn_dp", 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(m.group_ranks("ep", 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(ProcessMesh::carve_remainder("ep"), "edp");  // named by the mesh, never by the plugin
  EXPECT_EQ(m.group_ranks("edp", 5), (std::vector<int>{1, 5}));
  for (int r = 0; r < 8; ++r) {
    const auto small = m.group_ranks("tp", r), big = m.group_ranks("ffn_tp", r);
    EXPECT_TRUE(std::includes(big.begin(), big.end(), small.begin(), small.end())) << "rank " << r;
  }
  expect_partition(m);
  EXPECT_NE(m.describe().find("view ffn over tp x dp: ffn_tp = 4 split; ffn_dp = 2 replicate; (t)"), std::string::npos)
      << m.describe();
}

// Where a parameter's gradient is summed, from the roles alone: a replicated
// one over the data dimensions (cp and dp); one sharded along a view's
// dimension over that view's replicate dimensions in place of the base ones
// it covers (experts, carved out of cp x dp, over edp alone); one sharded
// over a base dimension as a replicated one.
TEST(ProcessMesh, GradientSumsFollowTheRolesAndTheViews) {
  MeshPlan plan;
  plan.claim("tp", 2, "tensor_parallel", MeshRole::kSplit);
  plan.claim("cp", 2, "context_parallel", MeshRole::kSequence);
  plan.view({"ffn", {"tp", "dp"}, {{"ffn_tp", 4, MeshRole::kSplit, "t"}, {"ffn_dp", 0, MeshRole::kReplicate, "t"}}, "t"});
  plan.carve("ep", 2, "expert_parallel", MeshRole::kSplit);
  const ProcessMesh m = resolved(plan, 16);
  using V = std::vector<std::string>;
  EXPECT_EQ(m.grad_sync_dims({}), (V{"cp", "dp"}));
  EXPECT_EQ(m.grad_sync_dims({"tp"}), (V{"cp", "dp"}));
  EXPECT_EQ(m.grad_sync_dims({"ep"}), (V{"edp"}));
  EXPECT_EQ(m.grad_sync_dims({"ffn_tp"}), (V{"cp", "ffn_dp"}));
  EXPECT_EQ(m.grad_sync_dims({"tp", "ep"}), (V{"edp"}));
  // Expert parallel folds over the cp ranks first (cp is inner to dp):
  // rank 2 (tp0 cp1 dp0) shares its experts' group with rank 0 (cp0 dp0).
  EXPECT_EQ(m.group_ranks("ep", 2), (std::vector<int>{0, 2}));
  EXPECT_EQ(m.group_size("edp"), 4);  // cp x dp = 8 ranks hold the same parameters, ep = 2 of them split experts
}

// Every role has one group even when several dimensions have it: the mesh
// joins the replicate dimensions (a feature's own with dp) and the data
// dimensions (replicate and sequence) into flat groups, so one collective
// sums over all of them; dimensions of size 1 take no part, and where no
// group joins a set (a view's and a base dimension) flat_over says so.
TEST(ProcessMesh, RoleFlatGroupsJoinTheDimensionsOfOneRole) {
  MeshPlan plan;
  plan.claim("rp", 2, "test_replicas", MeshRole::kReplicate);
  plan.claim("cp", 2, "context_parallel", MeshRole::kSequence);
  plan.claim("tp", 1, "tensor_parallel", MeshRole::kSplit);
  plan.view({"ffn", {"tp", "dp"}, {{"ffn_tp", 1, MeshRole::kSplit, "t"}, {"ffn_dp", 0, MeshRole::kReplicate, "t"}}, "t"});
  const ProcessMesh m = resolved(plan, 8);
  using V = std::vector<std::string>;
  EXPECT_EQ(m.replicate_dims(), (V{"rp", "dp"}));  // mesh order: a claimed replica inside dp
  const std::string rep = m.flat_over({"dp", "rp"});
  ASSERT_FALSE(rep.empty());
  EXPECT_EQ(m.group_size(rep), 4);
  EXPECT_EQ(m.flat_over({"rp", "dp"}), rep);  // any order
  const std::string data = m.flat_over({"cp", "dp", "rp"});
  ASSERT_FALSE(data.empty());
  EXPECT_EQ(m.group_size(data), 8);
  EXPECT_EQ(m.flat_over({"tp", "cp", "dp", "rp"}), data);  // tp has size 1
  EXPECT_EQ(m.flat_over({"dp"}), "dp");
  EXPECT_EQ(m.flat_over({"tp"}), "");
  EXPECT_EQ(m.flat_over({"cp", "ffn_dp"}), "");  // base and view: no group joins them
  // The replicas' group holds exactly the ranks that share cp's coordinate.
  for (int r : m.group_ranks(rep, 0)) EXPECT_EQ(m.group_index("cp", r), m.group_index("cp", 0));
}

// ZeRO over a flattened dp x cp: one shard group joining both.
TEST(ProcessMesh, FlatGroupJoinsReplicateDimensions) {
  MeshPlan plan;
  plan.claim("tp", 2, "tensor_parallel", MeshRole::kSplit);
  plan.claim("cp", 2, "context_parallel", MeshRole::kSequence);
  plan.flatten("dp_cp", {"dp", "cp"}, "zero");
  const ProcessMesh m = resolved(plan, 8);
  EXPECT_EQ(m.group_size("dp_cp"), 4);
  EXPECT_EQ(m.group_ranks("dp_cp", 0), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(m.group_ranks("dp_cp", 3), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(m.group_index("dp_cp", 5), 2);
  expect_partition(m);
}

TEST(ProcessMesh, OneRankAndDescribe) {
  EXPECT_EQ(ProcessMesh().world_size(), 1);
  EXPECT_EQ(ProcessMesh().order(), ProcessMesh::data_dim());
  const ProcessMesh m = grid(1, 2, 2);
  EXPECT_EQ(m.shape(), "pp=1 dp=2 tp=2 ep=1 edp=2");
  EXPECT_EQ(m.tag(3), "pp0 dp1 tp1");
  const auto d = m.describe();
  EXPECT_NE(d.find("rank 3 -> pp 0, dp 1, tp 1, ep 0, edp 1 -> tp[2,3] dp[1,3] pp[3] ep[3] edp[1,3]"),
            std::string::npos)
      << d;
  EXPECT_NE(d.find("order tp-dp-pp (innermost first)"), std::string::npos) << d;
  EXPECT_THROW(m.group_ranks("cp", 0), std::invalid_argument);
  EXPECT_EQ(m.group_size("cp"), 0);
}

TEST(MeshPlan, ConflictsAreNamed) {
  MeshPlan p;
  p.claim("tp", 2, "tensor_parallel", MeshRole::kSplit);
  p.claim("tp", 4, "other", MeshRole::kSplit);
  p.claim("dp", 2, "mine", MeshRole::kReplicate);
  p.claim("pp", 2, "pipeline_parallel", MeshRole::kPartition);
  p.claim("stages", 2, "odd", MeshRole::kPartition);
  p.claim("etdp", 2, "mine", MeshRole::kReplicate);
  p.carve("et", 2, "expert_parallel", MeshRole::kSplit);
  ASSERT_EQ(p.conflicts.size(), 4u);
  EXPECT_EQ(p.conflicts[0], "mesh dimension 'tp' is claimed by both 'tensor_parallel' and 'other'");
  EXPECT_EQ(p.conflicts[1],
            "mesh dimension 'dp' claimed by 'mine' is the mesh's own (world, and the data-parallel remainder dp); "
            "pick another name");
  EXPECT_EQ(p.conflicts[2],
            "mesh dimension 'stages' claimed by 'odd' as partition, but 'pp' (pipeline_parallel) already partitions "
            "the model: a mesh has one partition dimension");
  // The remainder the mesh names for a carve of "et" is "etdp", taken.
  EXPECT_EQ(p.conflicts[3], "mesh dimension 'etdp' is claimed by both 'mine' and 'expert_parallel'");
  EXPECT_EQ(p.size_of("tp"), 2);
  EXPECT_EQ(p.size_of("pp"), 2);
  EXPECT_EQ(p.size_of("unclaimed"), 1);
}

TEST(MeshPlan, ResolveRefusesWhatDoesNotFit) {
  MeshProblem problem;
  ProcessMesh m;
  {
    MeshPlan p;
    p.claim("pp", 2, "pipeline_parallel", MeshRole::kPartition);
    ASSERT_TRUE(hp::dist::resolve_mesh(p, 8, 0, m, problem));
    EXPECT_EQ(p.replicas, 4);
    EXPECT_EQ(m.shape(), "pp=2 dp=4");
    EXPECT_FALSE(hp::dist::resolve_mesh(p, 7, 0, m, problem));
    EXPECT_EQ(problem.key, "distributed");
    EXPECT_EQ(problem.rule,
              "world size must equal dp x pp, but 7 is not a multiple of the claimed sizes' product 2 "
              "[pp=2 (pipeline_parallel)]");
    EXPECT_FALSE(hp::dist::resolve_mesh(p, 8, 3, m, problem));
    EXPECT_EQ(problem.key, "distributed.data_parallel_size");
    EXPECT_EQ(problem.rule, "world size 8 != dp x pp = 3 x 2 [pp=2 (pipeline_parallel)]");
    EXPECT_EQ(problem.legal, "4 or 0 (derive)");
  }
  {
    MeshPlan p;
    p.carve("ep", 4, "expert_parallel", MeshRole::kSplit);
    EXPECT_FALSE(hp::dist::resolve_mesh(p, 2, 0, m, problem));
    EXPECT_EQ(problem.key + " = " + problem.value + ": " + problem.rule + " (legal: " + problem.legal + ")",
              "distributed = ep=4 dp=2: ep (claimed by expert_parallel) is carved out of dp and must divide its size "
              "(legal: a ep size dividing 2)");
  }
  {
    MeshPlan p;
    p.claim("tp", 2, "tensor_parallel", MeshRole::kSplit);
    p.order = "tp-pp";
    EXPECT_FALSE(hp::dist::resolve_mesh(p, 4, 0, m, problem));
    EXPECT_EQ(problem.key, "distributed.mesh_order");
    EXPECT_EQ(problem.rule, "names 'pp', which is not a dimension of this run (or is named twice)");
    EXPECT_EQ(problem.legal, "the dimensions tp, dp, each once, joined by '-', innermost first");
    p.order = "tp";
    EXPECT_FALSE(hp::dist::resolve_mesh(p, 4, 0, m, problem));
    EXPECT_EQ(problem.rule, "leaves out 'dp'");
    p.order = "dp-tp";
    ASSERT_TRUE(hp::dist::resolve_mesh(p, 4, 0, m, problem));
    EXPECT_EQ(m.group_ranks("tp", 0), (std::vector<int>{0, 2}));
  }
  {
    MeshPlan p;
    p.flatten("both", {"dp", "nowhere"}, "zero");
    EXPECT_FALSE(hp::dist::resolve_mesh(p, 2, 0, m, problem));
    EXPECT_EQ(problem.rule, "the flat group joins 'nowhere', which is not a mesh dimension");
  }
}

// An order string is cut at '-' into whole dimension names: "etp" is not
// "tp" (the tensor_parallel check of tp inside dp once matched substrings).
TEST(ProcessMesh, OrderDimsAreWholeNames) {
  EXPECT_EQ(hp::dist::order_dims("tp-dp-pp"), (std::vector<std::string>{"tp", "dp", "pp"}));
  EXPECT_EQ(hp::dist::order_dims("etp-dp"), (std::vector<std::string>{"etp", "dp"}));
  EXPECT_TRUE(hp::dist::order_dims("").empty());
}
