// The zero-bubble simulator (plugins/pipeline_parallel/zero_bubble.h)
// against the published figures and against the 1F1B simulator that
// exists: at P = 4, M = 8 with equal F, B and W, 1F1B idles 3/11 of the
// pipeline (27.3 %), ZB-H1 its formula's (P-1)(F+B-W) per rank (1/9 =
// 11.1 %; also at P = 2..8) at 1F1B's peak activation memory, ZB-V less
// than ZB-H1 and at its lower bound (P-1)/(6M+P-1) with equal chunk costs
// (5.9 % at P = 4, M = 8: the last rank cannot start before P - 1 forwards
// have run and then has 6M ops of its own, so no ZB-V schedule of equal
// costs idles less); at P = 2, M = 4, ZB-H1's idle fraction is at most half
// of 1F1B's. Every plan runs each F, B and W once,
// after its inputs, one op at a time per rank; the 1F1B plan's makespan is
// the existing simulator's for make_schedule(1f1b) with B and W fused.
#include "plugins/pipeline_parallel/zero_bubble.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "plugins/pipeline_parallel/schedule.h"

namespace {

using hp::pipeline::zb::Op;
using hp::pipeline::zb::Plan;
using hp::pipeline::zb::Scheme;

// Every op once, after its inputs, ops of a rank one after another.
void check_valid(const Plan& p) {
  const int C = p.P * p.V;
  const bool fused = p.scheme == Scheme::kOneFOneB;
  std::map<std::tuple<int, int, int>, double> finish;
  std::map<std::tuple<int, int, int>, double> start;
  for (const auto& ops : p.per_rank) {
    double free_at = 0;
    for (const Op& op : ops) {
      EXPECT_GE(op.start, free_at - 1e-12) << op.str();
      free_at = op.finish;
      const auto key = std::make_tuple(static_cast<int>(op.kind), op.chunk, op.mb);
      EXPECT_EQ(finish.count(key), 0u) << op.str() << " runs twice";
      finish[key] = op.finish;
      start[key] = op.start;
    }
  }
  EXPECT_EQ(finish.size(), static_cast<std::size_t>(C * p.M * (fused ? 2 : 3)));
  for (const auto& [key, s] : start) {
    const auto [kind, c, m] = key;
    auto after = [&](Op::Kind k, int cc) {
      const auto it = finish.find({static_cast<int>(k), cc, m});
      ASSERT_NE(it, finish.end());
      EXPECT_LE(it->second, s + 1e-12) << "op " << kind << " chunk " << c << " mb " << m;
    };
    if (kind == static_cast<int>(Op::Kind::kF) && c > 0) after(Op::Kind::kF, c - 1);
    if (kind == static_cast<int>(Op::Kind::kB)) {
      after(Op::Kind::kF, c);
      if (c < C - 1) after(Op::Kind::kB, c + 1);
    }
    if (kind == static_cast<int>(Op::Kind::kW)) after(Op::Kind::kB, c);
  }
}

TEST(ZeroBubble, PublishedFiguresAtFourStages) {
  const Plan one = hp::pipeline::zb::plan(Scheme::kOneFOneB, 4, 8);
  const Plan h1 = hp::pipeline::zb::plan(Scheme::kZbH1, 4, 8);
  const Plan v = hp::pipeline::zb::plan(Scheme::kZbV, 4, 8);
  for (const Plan* p : {&one, &h1, &v}) check_valid(*p);
  std::printf("P=4 M=8, F=B=W: idle 1f1b %.4f, zb_h1 %.4f, zbv %.4f\n", one.idle(), h1.idle(),
              v.idle());
  std::printf("%s%s", hp::pipeline::zb::table(h1).c_str(), hp::pipeline::zb::table(v).c_str());
  EXPECT_NEAR(one.idle(), 3.0 / 11.0, 1e-9);
  EXPECT_NEAR(h1.idle(), 1.0 / 9.0, 1e-9);
  EXPECT_LT(v.idle(), h1.idle());
  // No rank holds more activations than 1F1B's most loaded rank (P stages).
  const double most = *std::max_element(one.peak_activations.begin(), one.peak_activations.end());
  EXPECT_DOUBLE_EQ(most, 4.0);
  for (int r = 0; r < 4; ++r) {
    EXPECT_LE(h1.peak_activations[r], most + 1e-9) << "rank " << r;
    EXPECT_LE(v.peak_activations[r], most + 1e-9) << "rank " << r;
  }
}

TEST(ZeroBubble, HOneMatchesItsFormula) {
  // Idle per rank (P - 1)(F + B - W) over a makespan of M(F + B + W) + that.
  for (const auto& [P, M] : std::vector<std::pair<int, int>>{{2, 4}, {3, 6}, {4, 16}, {8, 16}}) {
    const Plan h1 = hp::pipeline::zb::plan(Scheme::kZbH1, P, M);
    check_valid(h1);
    EXPECT_NEAR(h1.idle(), (P - 1.0) / (3.0 * M + P - 1.0), 1e-9) << "P " << P << " M " << M;
  }
}

// ZB-V reaches the bound of any schedule of its V with equal costs: the
// last rank's first op waits for P - 1 forwards, every rank runs 6M ops,
// so the makespan is at least 6M + P - 1 and the mean idle at least
// (P - 1) / (6M + P - 1). The executor's zbv lists are the plan's.
TEST(ZeroBubble, VReachesItsLowerBound) {
  for (const auto& [P, M] : std::vector<std::pair<int, int>>{{2, 4}, {4, 8}, {4, 16}, {8, 16}}) {
    const Plan v = hp::pipeline::zb::plan(Scheme::kZbV, P, M);
    check_valid(v);
    EXPECT_NEAR(v.idle(), (P - 1.0) / (6.0 * M + P - 1.0), 1e-9) << "P " << P << " M " << M;
    std::vector<std::vector<hp::pipeline::Action>> lists;
    for (int r = 0; r < P; ++r)
      lists.push_back(hp::pipeline::make_schedule(hp::pipeline::ScheduleKind::kZbV, P, M, 2, r));
    for (int r = 0; r < P; ++r) {
      ASSERT_EQ(v.per_rank[r].size(), lists[r].size());
      for (std::size_t i = 0; i < lists[r].size(); ++i) EXPECT_EQ(v.per_rank[r][i].str(), lists[r][i].str());
    }
    const auto sim = hp::pipeline::simulate(lists, P, 2, 1.0, 2.0, hp::pipeline::Placement::kV);
    ASSERT_TRUE(sim.deadlock_free);
    EXPECT_NEAR(sim.makespan, v.makespan, 1e-9);
  }
}

// Plans are made from measured costs (the pipeline's third step), so
// every ratio a step can measure must give a complete plan, never a
// deadlock: B from 0.25 to 3 F, W from 0.25 to 2 F (a bf16 run measured B
// 1.75 F, W 0.25 F, which deadlocked zbv at two stages and 8 micro-batches
// before the fix), at 2 and 4 stages, 1 to 8 micro-batches.
TEST(ZeroBubble, EveryMeasuredCostRatioPlans) {
  for (Scheme scheme : {Scheme::kZbH1, Scheme::kZbV})
    for (int P : {2, 4})
      for (int M : {1, 2, 3, 4, 8})
        for (double b : {0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0})
          for (double w : {0.25, 0.5, 0.75, 1.0, 1.5, 2.0}) {
            SCOPED_TRACE(std::string(hp::pipeline::zb::to_string(scheme)) + " P " + std::to_string(P) + " M " +
                         std::to_string(M) + " B " + std::to_string(b) + " W " + std::to_string(w));
            Plan p;
            ASSERT_NO_THROW(p = hp::pipeline::zb::plan(scheme, P, M, {1.0, b, w}));
            check_valid(p);
          }
}

TEST(ZeroBubble, HalfOfOneFOneBsIdleAtTwoStages) {
  const Plan one = hp::pipeline::zb::plan(Scheme::kOneFOneB, 2, 4);
  const Plan h1 = hp::pipeline::zb::plan(Scheme::kZbH1, 2, 4);
  check_valid(one);
  check_valid(h1);
  std::printf("P=2 M=4, F=B=W: idle 1f1b %.4f, zb_h1 %.4f\n", one.idle(), h1.idle());
  EXPECT_LE(h1.idle(), 0.5 * one.idle());
}

TEST(ZeroBubble, OneFOneBAgreesWithTheScheduleSimulator) {
  for (int P : {2, 3, 4}) {
    for (int M : {1, 4, 8}) {
      for (const auto& c :
           {hp::pipeline::zb::Costs{1, 1, 1}, hp::pipeline::zb::Costs{1, 1.5, 0.5}}) {
        const Plan p = hp::pipeline::zb::plan(Scheme::kOneFOneB, P, M, c);
        std::vector<std::vector<hp::pipeline::Action>> lists;
        for (int r = 0; r < P; ++r)
          lists.push_back(
              hp::pipeline::make_schedule(hp::pipeline::ScheduleKind::kOneFOneB, P, M, 1, r));
        const auto sim = hp::pipeline::simulate(lists, P, 1, c.f, c.b + c.w);
        ASSERT_TRUE(sim.deadlock_free);
        EXPECT_NEAR(p.makespan, sim.makespan, 1e-9) << "P " << P << " M " << M;
        for (int r = 0; r < P; ++r) {
          ASSERT_EQ(p.per_rank[r].size(), lists[r].size());
          for (std::size_t i = 0; i < lists[r].size(); ++i)
            EXPECT_EQ(p.per_rank[r][i].str(), lists[r][i].str());
        }
      }
    }
  }
}

// The executor's zb_h1 lists are the plan's (F, B and W in its order), and
// the schedule simulator, with W as half of a backward, times them as the
// plan does with equal F, B and W: the same makespan and idle per rank.
TEST(ZeroBubble, ExecutorListsOfHOneAreThePlans) {
  for (int P : {2, 3, 4}) {
    for (int M : {1, 4, 8}) {
      const Plan p = hp::pipeline::zb::plan(Scheme::kZbH1, P, M);
      std::vector<std::vector<hp::pipeline::Action>> lists;
      for (int r = 0; r < P; ++r)
        lists.push_back(hp::pipeline::make_schedule(hp::pipeline::ScheduleKind::kZbH1, P, M, 1, r));
      for (int r = 0; r < P; ++r) {
        ASSERT_EQ(p.per_rank[r].size(), lists[r].size());
        for (std::size_t i = 0; i < lists[r].size(); ++i) EXPECT_EQ(p.per_rank[r][i].str(), lists[r][i].str());
      }
      const auto sim = hp::pipeline::simulate(lists, P, 1, 1.0, 2.0);
      ASSERT_TRUE(sim.deadlock_free) << "P " << P << " M " << M;
      EXPECT_NEAR(sim.makespan, p.makespan, 1e-9) << "P " << P << " M " << M;
      for (int r = 0; r < P; ++r) EXPECT_NEAR(sim.idle_fraction[r], p.idle_fraction[r], 1e-9);
    }
  }
  EXPECT_EQ(hp::pipeline::parse_schedule("zb_h1"), hp::pipeline::ScheduleKind::kZbH1);
  EXPECT_THROW(hp::pipeline::make_schedule(hp::pipeline::ScheduleKind::kZbH1, 2, 4, 2, 0), std::invalid_argument);
}

TEST(ZeroBubble, RefusesBadArguments) {
  EXPECT_THROW(hp::pipeline::zb::plan(Scheme::kZbH1, 0, 4), std::invalid_argument);
  EXPECT_THROW(hp::pipeline::zb::plan(Scheme::kZbH1, 2, 4, {1, 0, 1}), std::invalid_argument);
  EXPECT_THROW(hp::pipeline::zb::parse_scheme("zb_h2"), std::invalid_argument);
  EXPECT_EQ(hp::pipeline::zb::parse_scheme("zbv"), Scheme::kZbV);
}

}  // namespace
