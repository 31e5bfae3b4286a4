// Pure logic of the pipeline_parallel plugin: block partitioning, schedules
// (checked against hand-written lists, structural invariants and a
// discrete-event simulation against the textbook bubble formulas), and the
// stage message header codec.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "plugins/pipeline_parallel/partition.h"
#include "plugins/pipeline_parallel/schedule.h"
#include "plugins/pipeline_parallel/stage_message.h"

namespace hp::pipeline {
namespace {

// The message of the E thrown by f, or a note that nothing (or something else) was thrown.
template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<other exception: ") + e.what() + ">";
  }
  return "<no exception>";
}

::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

// ---------------------------------------------------------------------------
// Partition
// ---------------------------------------------------------------------------

// Sum of costs[lo, hi), left to right like the implementation, so optimal
// values compare exactly.
double range_cost(const std::vector<double>& costs, int lo, int hi) {
  double s = 0;
  for (int i = lo; i < hi; ++i) s += costs[i];
  return s;
}

double sum_of_squares(const std::vector<double>& costs, const std::vector<int>& first) {
  double s = 0;
  for (std::size_t c = 0; c + 1 < first.size(); ++c) {
    const double x = range_cost(costs, first[c], first[c + 1]);
    s += x * x;
  }
  return s;
}

// Every split of costs into `chunks` non-empty contiguous parts, as `first`
// vectors, in lexicographic order.
std::vector<std::vector<int>> all_splits(int n, int chunks) {
  std::vector<std::vector<int>> out;
  std::vector<int> first{0};
  std::function<void(int)> rec = [&](int left) {  // `left` chunks still to place
    const int at = first.back();
    if (left == 1) {
      first.push_back(n);
      out.push_back(first);
      first.pop_back();
      return;
    }
    for (int end = at + 1; end <= n - (left - 1); ++end) {
      first.push_back(end);
      rec(left - 1);
      first.pop_back();
    }
  };
  rec(chunks);
  return out;
}

double max_cost_of(const std::vector<double>& costs, const std::vector<int>& first) {
  double m = 0;
  for (std::size_t c = 0; c + 1 < first.size(); ++c) {
    m = std::max(m, range_cost(costs, first[c], first[c + 1]));
  }
  return m;
}

void expect_well_formed(const Partition& p, const std::vector<double>& costs, int chunks) {
  ASSERT_EQ(p.chunks(), chunks);
  ASSERT_EQ(p.cost.size(), static_cast<std::size_t>(chunks));
  EXPECT_EQ(p.first.front(), 0);
  EXPECT_EQ(p.first.back(), static_cast<int>(costs.size()));
  for (int c = 0; c < chunks; ++c) {
    EXPECT_GE(p.chunk_size(c), 1) << "chunk " << c;
    EXPECT_DOUBLE_EQ(p.cost[c], range_cost(costs, p.first[c], p.first[c + 1])) << "chunk " << c;
  }
}

TEST(Partition, UniformCostsSplitEvenly) {
  const std::vector<double> twelve(12, 1.0);
  Partition p = partition_balanced(twelve, 4);
  expect_well_formed(p, twelve, 4);
  EXPECT_EQ(p.first, (std::vector<int>{0, 3, 6, 9, 12}));
  EXPECT_EQ(p.cost, (std::vector<double>{3, 3, 3, 3}));

  // 10 into 4: max 3 is optimal for 1+3+3+3, 3+3+3+1, 2+2+3+3, ...; the most
  // even split wins, earlier chunks lighter on the remaining tie.
  const std::vector<double> ten(10, 1.0);
  p = partition_balanced(ten, 4);
  EXPECT_EQ(p.first, (std::vector<int>{0, 2, 4, 7, 10}));
  EXPECT_DOUBLE_EQ(p.max_cost(), 3.0);

  // One block per chunk, and everything in one chunk.
  EXPECT_EQ(partition_balanced(ten, 10).first,
            (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  EXPECT_EQ(partition_balanced(ten, 1).first, (std::vector<int>{0, 10}));
}

TEST(Partition, SkewedEmbeddingAndHead) {
  // Embedding 8, ten blocks of 2, head 9: the optimum is 10. Two splits
  // reach it with the same sum of squares (8|10|10|9 and 10|10|8|9); the
  // lexicographically smaller one keeps the embedding alone.
  std::vector<double> costs{8};
  costs.insert(costs.end(), 10, 2.0);
  costs.push_back(9);
  const Partition p = partition_balanced(costs, 4);
  expect_well_formed(p, costs, 4);
  EXPECT_EQ(p.first, (std::vector<int>{0, 1, 6, 11, 12}));
  EXPECT_EQ(p.cost, (std::vector<double>{8, 10, 10, 9}));
  EXPECT_DOUBLE_EQ(p.max_cost(), 10.0);
}

TEST(Partition, MatchesBruteForceOnRandomCosts) {
  std::mt19937 rng(20240611);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  int cases = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int n = 1 + trial % 10;
    std::vector<double> costs(n);
    for (double& c : costs) c = 1e5 * unit(rng);
    if (trial % 3 == 0) {  // big embedding and head around small blocks
      costs.front() *= 10;
      costs.back() *= 12;
    }
    for (int chunks = 1; chunks <= n; ++chunks, ++cases) {
      const Partition p = partition_balanced(costs, chunks);
      expect_well_formed(p, costs, chunks);
      double best = std::numeric_limits<double>::infinity();
      for (const auto& split : all_splits(n, chunks))
        best = std::min(best, max_cost_of(costs, split));
      EXPECT_DOUBLE_EQ(p.max_cost(), best) << "n=" << n << " chunks=" << chunks;
      // Secondary criterion: no optimal split is more even.
      double least_sq = std::numeric_limits<double>::infinity();
      for (const auto& split : all_splits(n, chunks)) {
        if (max_cost_of(costs, split) == best) {
          least_sq = std::min(least_sq, sum_of_squares(costs, split));
        }
      }
      EXPECT_NEAR(sum_of_squares(costs, p.first), least_sq, 1e-9 * least_sq);
    }
  }
  EXPECT_EQ(cases, 330);
}

TEST(Partition, TieBreakIsExactOnIntegerCosts) {
  // Small integer costs (zeros included) make many exact ties; the chosen
  // split must be the lexicographically smallest of the most even optimal ones.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> small(0, 5);
  for (int trial = 0; trial < 40; ++trial) {
    const int n = 2 + trial % 8;
    std::vector<double> costs(n);
    for (double& c : costs) c = small(rng);
    for (int chunks = 1; chunks <= n; ++chunks) {
      const auto splits = all_splits(n, chunks);
      double best = std::numeric_limits<double>::infinity();
      for (const auto& s : splits) best = std::min(best, max_cost_of(costs, s));
      double least_sq = std::numeric_limits<double>::infinity();
      for (const auto& s : splits) {
        if (max_cost_of(costs, s) == best) least_sq = std::min(least_sq, sum_of_squares(costs, s));
      }
      std::vector<int> expected;
      for (const auto& s : splits) {  // lexicographic order: the first hit is the smallest
        if (max_cost_of(costs, s) == best && sum_of_squares(costs, s) == least_sq) {
          expected = s;
          break;
        }
      }
      EXPECT_EQ(partition_balanced(costs, chunks).first, expected)
          << "trial " << trial << " chunks " << chunks;
    }
  }
}

TEST(Partition, ManualSplit) {
  const std::vector<double> costs{1, 2, 3, 4, 5, 6};
  const Partition p = partition_manual(costs, {1, 2, 3}, 3);
  expect_well_formed(p, costs, 3);
  EXPECT_EQ(p.first, (std::vector<int>{0, 1, 3, 6}));
  EXPECT_EQ(p.cost, (std::vector<double>{1, 5, 15}));
  EXPECT_DOUBLE_EQ(p.max_cost(), 15.0);
}

TEST(Partition, Describe) {
  const std::vector<double> costs{4e5, 4e5, 4e5, 3.5e5, 3.5e5, 4e5, 37.5};
  EXPECT_EQ(partition_manual(costs, {3, 3, 1}, 3).describe(),
            "chunk 0: blocks 0-2 (cost 1.2e+06) | chunk 1: blocks 3-5 (cost 1.1e+06) | "
            "chunk 2: block 6 (cost 37.5)");
}

TEST(Partition, Errors) {
  const std::vector<double> three(3, 1.0), six(6, 1.0);
  EXPECT_EQ(error_of<PartitionError>([&] { partition_balanced(three, 4); }),
            "4 pipeline chunks need at least 4 blocks (one per chunk); the model has 3.");
  EXPECT_EQ(error_of<PartitionError>([&] { partition_balanced(three, 0); }),
            "the pipeline needs at least 1 chunk; 0 were asked for.");
  EXPECT_EQ(error_of<PartitionError>([&] { partition_balanced({}, 1); }),
            "1 pipeline chunks need at least 1 blocks (one per chunk); the model has 0.");
  EXPECT_EQ(error_of<PartitionError>([&] {
              partition_balanced({1, -2, 3}, 2);
            }),
            "block 1 has cost -2: block costs must be finite and >= 0.");
  EXPECT_TRUE(contains(error_of<PartitionError>([&] {
                         partition_balanced({1, std::nan(""), 3}, 2);
                       }),
                       "block 1 has cost"));

  // Manual: entry count, empty chunk, wrong total — each a sentence with numbers.
  EXPECT_EQ(error_of<PartitionError>([&] {
              partition_manual(six, {2, 2, 2}, 4);
            }),
            "balance has 3 entries; the pipeline has 4 chunks (one entry per chunk).");
  EXPECT_EQ(error_of<PartitionError>([&] {
              partition_manual(six, {3, 2, 0, 1}, 4);
            }),
            "balance[2] = 0: every pipeline chunk needs at least one block.");
  EXPECT_EQ(error_of<PartitionError>([&] {
              partition_manual(six, {2, -1, 3, 2}, 4);
            }),
            "balance[1] = -1: every pipeline chunk needs at least one block.");
  EXPECT_EQ(error_of<PartitionError>([&] {
              partition_manual(six, {1, 1, 2, 1}, 4);
            }),
            "balance lists 5 blocks; the model has 6.");
  EXPECT_EQ(error_of<PartitionError>([&] {
              partition_manual(six, {2, 2, 2, 2}, 4);
            }),
            "balance lists 8 blocks; the model has 6.");
  // A PartitionError is an invalid_argument (config errors catch that).
  EXPECT_THROW(partition_manual(six, {}, 0), std::invalid_argument);
}

// ---------------------------------------------------------------------------
// Schedules
// ---------------------------------------------------------------------------

std::vector<std::string> strs(const std::vector<Action>& actions) {
  std::vector<std::string> out;
  out.reserve(actions.size());
  for (const Action& a : actions) out.push_back(a.str());
  return out;
}

std::vector<std::string> split_words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::vector<std::vector<Action>> all_ranks(ScheduleKind kind, int P, int M, int V) {
  std::vector<std::vector<Action>> out;
  out.reserve(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r) out.push_back(make_schedule(kind, P, M, V, r));
  return out;
}

TEST(Schedule, NamesRoundTrip) {
  for (ScheduleKind k :
       {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kInterleaved, ScheduleKind::kZbH1,
        ScheduleKind::kZbV}) {
    EXPECT_EQ(parse_schedule(to_string(k)), k);
  }
  EXPECT_STREQ(to_string(ScheduleKind::kInterleaved), "interleaved_1f1b");
  EXPECT_EQ(error_of<std::invalid_argument>([] { parse_schedule("1F1B"); }),
            "unknown pipeline schedule '1F1B'; expected gpipe, 1f1b, interleaved_1f1b, zb_h1 or zbv");
  EXPECT_THROW(parse_schedule(""), std::invalid_argument);
  EXPECT_THROW(parse_schedule("interleaved"), std::invalid_argument);
}

TEST(Schedule, ActionStrings) {
  EXPECT_EQ((Action{Action::Kind::kForward, 3, 1}.str()), "F3.1");
  EXPECT_EQ((Action{Action::Kind::kBackward, 0, 2}.str()), "B0.2");
  EXPECT_EQ((Action{Action::Kind::kBackward, 12, 10}.str()), "B12.10");
}

TEST(Schedule, GPipeByHand) {
  EXPECT_EQ(strs(make_schedule(ScheduleKind::kGPipe, 2, 3, 1, 1)),
            split_words("F1.0 F1.1 F1.2 B1.0 B1.1 B1.2"));
}

TEST(Schedule, OneFOneBByHand) {
  // Rank 0 warms up with P - 0 - 1 = 1 forward, rank 1 (the last) with none.
  EXPECT_EQ(strs(make_schedule(ScheduleKind::kOneFOneB, 2, 4, 1, 0)),
            split_words("F0.0 F0.1 B0.0 F0.2 B0.1 F0.3 B0.2 B0.3"));
  EXPECT_EQ(strs(make_schedule(ScheduleKind::kOneFOneB, 2, 4, 1, 1)),
            split_words("F1.0 B1.0 F1.1 B1.1 F1.2 B1.2 F1.3 B1.3"));
  // Fewer micro-batches than the warm-up: all forwards, then all backwards.
  EXPECT_EQ(strs(make_schedule(ScheduleKind::kOneFOneB, 4, 2, 1, 0)),
            split_words("F0.0 F0.1 B0.0 B0.1"));
}

TEST(Schedule, InterleavedByHand) {
  // P = 2, V = 2, M = 4. Rank r owns chunks r (slot 0) and r + 2 (slot 1);
  // each rank runs M V = 8 forwards and 8 backwards.
  //
  // k-th forward: slot (k / 2) % 2, mb (k / 4) * 2 + k % 2:
  //   k:     0   1   2   3   4   5   6   7
  //   slot:  0   0   1   1   0   0   1   1
  //   mb:    0   1   0   1   2   3   2   3
  // k-th backward: slot 1 - (k / 2) % 2, same mb:
  //   slot:  1   1   0   0   1   1   0   0
  //
  // Rank 0: warm-up min((2 - 0 - 1) * 2 + (2 - 1) * 2, 8) = 4 forwards
  //   F0.0 F0.1 F2.0 F2.1;
  // steady state pairs forward k = 4..7 with backward k = 0..3:
  //   F0.2 B2.0 | F0.3 B2.1 | F2.2 B0.0 | F2.3 B0.1;
  // cool-down: backwards k = 4..7: B2.2 B2.3 B0.2 B0.3.
  EXPECT_EQ(strs(make_schedule(ScheduleKind::kInterleaved, 2, 4, 2, 0)),
            split_words("F0.0 F0.1 F2.0 F2.1 F0.2 B2.0 F0.3 B2.1 F2.2 B0.0 F2.3 B0.1 "
                        "B2.2 B2.3 B0.2 B0.3"));
  // Rank 1 (chunks 1 and 3): warm-up (2 - 1 - 1) * 2 + 2 = 2 forwards F1.0 F1.1;
  // steady state: F3.0 B3.0 | F3.1 B3.1 | F1.2 B1.0 | F1.3 B1.1 | F3.2 B3.2 | F3.3 B3.3;
  // cool-down: B1.2 B1.3.
  EXPECT_EQ(strs(make_schedule(ScheduleKind::kInterleaved, 2, 4, 2, 1)),
            split_words("F1.0 F1.1 F3.0 B3.0 F3.1 B3.1 F1.2 B1.0 F1.3 B1.1 F3.2 B3.2 "
                        "F3.3 B3.3 B1.2 B1.3"));
}

TEST(Schedule, InterleavedWarmUpFollowsMegatron) {
  // Forwards before the first backward: the warm-up plus the steady state's
  // first forward (if any forwards remain after the warm-up).
  for (int P : {2, 4}) {
    for (int V : {2, 3}) {
      for (int M : {P, 2 * P, 4 * P}) {
        for (int r = 0; r < P; ++r) {
          const auto list = make_schedule(ScheduleKind::kInterleaved, P, M, V, r);
          const int warmup = std::min((P - r - 1) * 2 + (V - 1) * P, M * V);
          const int leading = static_cast<int>(
              std::find_if(list.begin(), list.end(),
                           [](const Action& a) { return a.kind == Action::Kind::kBackward; }) -
              list.begin());
          EXPECT_EQ(leading, warmup < M * V ? warmup + 1 : warmup)
              << "P=" << P << " V=" << V << " M=" << M << " rank " << r;
        }
      }
    }
  }
}

TEST(Schedule, InterleavedWithOneChunkIsOneFOneB) {
  for (int P : {1, 2, 4}) {
    for (int M : {1, 2, 3, 4, 8}) {  // no M % P requirement with V == 1
      for (int r = 0; r < P; ++r) {
        EXPECT_EQ(make_schedule(ScheduleKind::kInterleaved, P, M, 1, r),
                  make_schedule(ScheduleKind::kOneFOneB, P, M, 1, r))
            << "P=" << P << " M=" << M << " rank " << r;
      }
    }
  }
}

// Every configuration of the grid: what must hold of any valid schedule, and
// the bubble the theory predicts.
//
// With uniform costs (forward f, backward 2f per chunk, f = 1/V so a rank's
// V chunks cost what one stage costs) every rank is busy 3M, and the
// simulated makespan is exactly the textbook one:
//   gpipe, 1f1b:  3 (M + P - 1)            idle = (P - 1) / (M + P - 1)
//   interleaved:  3 (M + (P - 1) / V)      idle = (P - 1) / (V M + P - 1)
// As busy time is the same on every rank, each rank's idle fraction (not
// only the average) equals the formula. Checked to 1e-9 (1/3 is inexact).
struct Config {
  ScheduleKind kind;
  int P, M, V;
};

std::vector<Config> grid() {
  std::vector<Config> out;
  for (int P : {1, 2, 4}) {
    for (int M : {1, 2, 4, 8}) {
      out.push_back({ScheduleKind::kGPipe, P, M, 1});
      out.push_back({ScheduleKind::kOneFOneB, P, M, 1});
      if (M % P == 0) {
        for (int V : {2, 3}) out.push_back({ScheduleKind::kInterleaved, P, M, V});
      }
    }
  }
  return out;
}

std::string name(const Config& c) {
  return std::string(to_string(c.kind)) + " P=" + std::to_string(c.P) +
         " M=" + std::to_string(c.M) + " V=" + std::to_string(c.V);
}

TEST(Schedule, EveryActionExactlyOnceForwardBeforeBackward) {
  int configs = 0;
  for (const Config& c : grid()) {
    ++configs;
    for (int r = 0; r < c.P; ++r) {
      const auto list = make_schedule(c.kind, c.P, c.M, c.V, r);
      SCOPED_TRACE(name(c) + " rank " + std::to_string(r));
      EXPECT_EQ(list.size(), static_cast<std::size_t>(2 * c.M * c.V));
      std::map<std::pair<int, int>, int> fwd_at, bwd_at;  // (chunk, mb) -> position
      for (int i = 0; i < static_cast<int>(list.size()); ++i) {
        const Action& a = list[i];
        ASSERT_GE(a.chunk, 0);
        ASSERT_LT(a.chunk, c.P * c.V);
        EXPECT_EQ(a.chunk % c.P, r) << a.str() << " is not this rank's chunk";
        ASSERT_GE(a.mb, 0);
        ASSERT_LT(a.mb, c.M);
        auto& seen = a.kind == Action::Kind::kForward ? fwd_at : bwd_at;
        EXPECT_TRUE(seen.emplace(std::make_pair(a.chunk, a.mb), i).second)
            << a.str() << " appears twice";
      }
      EXPECT_EQ(fwd_at.size(), static_cast<std::size_t>(c.M * c.V));
      EXPECT_EQ(bwd_at.size(), static_cast<std::size_t>(c.M * c.V));
      for (const auto& [key, pos] : bwd_at) {
        auto f = fwd_at.find(key);
        ASSERT_NE(f, fwd_at.end());
        EXPECT_LT(f->second, pos) << "backward of chunk " << key.first << " mb " << key.second
                                  << " runs before its forward";
      }
    }
  }
  EXPECT_EQ(configs, 12 + 12 + 2 * (4 + 3 + 2));
}

TEST(Schedule, SimulationMatchesBubbleTheory) {
  for (const Config& c : grid()) {
    SCOPED_TRACE(name(c));
    const double f = 1.0 / c.V;
    const Simulation sim = simulate(all_ranks(c.kind, c.P, c.M, c.V), c.P, c.V, f, 2 * f);
    ASSERT_TRUE(sim.deadlock_free);
    ASSERT_EQ(sim.idle_fraction.size(), static_cast<std::size_t>(c.P));
    const double P = c.P, M = c.M, V = c.V;
    const double theory = (P - 1) / (V * M + P - 1);  // V == 1 for gpipe and 1f1b
    EXPECT_NEAR(sim.makespan, 3 * (M + (P - 1) / V), 1e-9);
    double avg = 0;
    for (double idle : sim.idle_fraction) {
      EXPECT_NEAR(idle, theory, 1e-9);
      avg += idle / c.P;
    }
    EXPECT_NEAR(avg, theory, 1e-9);
  }
}

TEST(Schedule, PeakInFlight) {
  for (int P : {1, 2, 4}) {
    for (int M : {1, 2, 4, 8}) {
      const auto one_f = simulate(all_ranks(ScheduleKind::kOneFOneB, P, M, 1), P, 1);
      const auto gpipe = simulate(all_ranks(ScheduleKind::kGPipe, P, M, 1), P, 1);
      for (int r = 0; r < P; ++r) {
        // 1F1B bounds the stash by the ranks downstream; GPipe stashes everything.
        EXPECT_EQ(one_f.peak_in_flight[r], std::min(P - r, M)) << "P=" << P << " M=" << M;
        EXPECT_EQ(gpipe.peak_in_flight[r], M) << "P=" << P << " M=" << M;
      }
      EXPECT_EQ(one_f.peak_in_flight[0], std::min(P, M));
    }
  }
  // Interleaved rank 0 of the hand-worked case: 4 warm-up forwards + 1 steady.
  EXPECT_EQ(simulate(all_ranks(ScheduleKind::kInterleaved, 2, 4, 2), 2, 2).peak_in_flight,
            (std::vector<int>{5, 3}));
}

TEST(Schedule, SimulationByHand) {
  // GPipe, 2 ranks, 1 micro-batch: F0.0 [0,1] F1.0 [1,2] B1.0 [2,4] B0.0 [4,6].
  const Simulation sim = simulate(all_ranks(ScheduleKind::kGPipe, 2, 1, 1), 2, 1, 1.0, 2.0);
  EXPECT_TRUE(sim.deadlock_free);
  EXPECT_DOUBLE_EQ(sim.makespan, 6.0);
  EXPECT_EQ(sim.idle_fraction, (std::vector<double>{0.5, 0.5}));
  // Unequal costs: the last rank's backward gates everything upstream.
  EXPECT_DOUBLE_EQ(simulate(all_ranks(ScheduleKind::kGPipe, 2, 1, 1), 2, 1, 1.0, 5.0).makespan,
                   12.0);
}

TEST(Schedule, SimulationDetectsDeadlocks) {
  using K = Action::Kind;
  // A backward listed before its own forward.
  Simulation sim = simulate({{{K::kBackward, 0, 0}, {K::kForward, 0, 0}}}, 1, 1);
  EXPECT_FALSE(sim.deadlock_free);
  EXPECT_TRUE(sim.idle_fraction.empty());
  // A cycle across ranks: rank 1 first wants F1.1, which needs F0.1, which
  // rank 0 runs only after B0.0, which needs B1.0 — queued behind F1.1.
  sim = simulate(
      {{{K::kForward, 0, 0}, {K::kBackward, 0, 0}, {K::kForward, 0, 1}, {K::kBackward, 0, 1}},
       {{K::kForward, 1, 1}, {K::kForward, 1, 0}, {K::kBackward, 1, 0}, {K::kBackward, 1, 1}}},
      2, 1);
  EXPECT_FALSE(sim.deadlock_free);
  // Subtler: rank 0 without its warm-up forward against rank 1 in GPipe
  // order. Rank 1 wants F1.1 before B1.0, but F0.1 comes after B0.0, which
  // needs B1.0.
  const std::vector<Action> no_warmup{
      {K::kForward, 0, 0}, {K::kBackward, 0, 0}, {K::kForward, 0, 1}, {K::kBackward, 0, 1}};
  sim = simulate(
      {no_warmup,
       {{K::kForward, 1, 0}, {K::kForward, 1, 1}, {K::kBackward, 1, 0}, {K::kBackward, 1, 1}}},
      2, 1);
  EXPECT_FALSE(sim.deadlock_free);
  // With rank 1 alternating too it runs (serially: makespan 2 * (1 + 1 + 2 + 2)).
  sim = simulate(
      {no_warmup,
       {{K::kForward, 1, 0}, {K::kBackward, 1, 0}, {K::kForward, 1, 1}, {K::kBackward, 1, 1}}},
      2, 1);
  EXPECT_TRUE(sim.deadlock_free);
  EXPECT_DOUBLE_EQ(sim.makespan, 12.0);
  // A missing action: B0.0 waits forever for B1.0.
  sim = simulate({{{K::kForward, 0, 0}, {K::kBackward, 0, 0}}, {{K::kForward, 1, 0}}}, 2, 1);
  EXPECT_FALSE(sim.deadlock_free);
}

TEST(Schedule, SimulationRejectsMisplacedActions) {
  using K = Action::Kind;
  EXPECT_EQ(error_of<std::invalid_argument>([] {
              simulate({{{K::kForward, 1, 0}}, {{K::kForward, 0, 0}}}, 2, 1);
            }),
            "simulate: action F1.0 does not belong on rank 0 of 2");
  EXPECT_THROW(simulate({{}}, 2, 1), std::invalid_argument);
  EXPECT_THROW(simulate({{{K::kForward, 2, 0}}}, 1, 2), std::invalid_argument);
}

TEST(Schedule, ForwardOnly) {
  EXPECT_EQ(strs(make_forward_only(2, 3, 1, 1)), split_words("F1.0 F1.1 F1.2"));
  EXPECT_EQ(strs(make_forward_only(2, 4, 2, 0)),
            split_words("F0.0 F0.1 F2.0 F2.1 F0.2 F0.3 F2.2 F2.3"));
  // P does not divide M: the last group is smaller.
  EXPECT_EQ(strs(make_forward_only(2, 3, 2, 1)), split_words("F1.0 F1.1 F3.0 F3.1 F1.2 F3.2"));
  for (int P : {1, 2, 4}) {
    for (int M : {1, 2, 3, 4, 8}) {
      for (int V : {1, 2, 3}) {
        SCOPED_TRACE("P=" + std::to_string(P) + " M=" + std::to_string(M) +
                     " V=" + std::to_string(V));
        std::vector<std::vector<Action>> lists;
        for (int r = 0; r < P; ++r) {
          lists.push_back(make_forward_only(P, M, V, r));
          EXPECT_EQ(lists.back().size(), static_cast<std::size_t>(M * V));
        }
        const Simulation sim = simulate(lists, P, V, 1.0 / V, 2.0 / V);
        ASSERT_TRUE(sim.deadlock_free);
        // Full groups keep every rank busy after the fill: M + (P - 1) / V.
        if (M % P == 0) {
          EXPECT_NEAR(sim.makespan, M + (P - 1.0) / V, 1e-9);
        }
      }
    }
  }
}

// zbv's V: rank r runs chunks r and 2P - 1 - r; forward-only lists visit
// them in model order per group of P micro-batches and never deadlock.
TEST(Schedule, VPlacement) {
  using hp::pipeline::Placement;
  EXPECT_EQ(hp::pipeline::placement_of(ScheduleKind::kZbV), Placement::kV);
  EXPECT_EQ(hp::pipeline::placement_of(ScheduleKind::kInterleaved), Placement::kLoop);
  EXPECT_EQ(hp::pipeline::chunks_per_rank(ScheduleKind::kZbV, 1), 2);
  EXPECT_EQ(hp::pipeline::chunks_per_rank(ScheduleKind::kInterleaved, 3), 3);
  EXPECT_EQ(hp::pipeline::chunks_of_rank(Placement::kV, 4, 2, 0), (std::vector<int>{0, 7}));
  EXPECT_EQ(hp::pipeline::chunks_of_rank(Placement::kV, 4, 2, 3), (std::vector<int>{3, 4}));
  EXPECT_EQ(hp::pipeline::chunks_of_rank(Placement::kLoop, 4, 2, 3), (std::vector<int>{3, 7}));
  EXPECT_EQ(strs(make_forward_only(2, 4, 2, 0, Placement::kV)),
            split_words("F0.0 F0.1 F3.0 F3.1 F0.2 F0.3 F3.2 F3.3"));
  for (int P : {1, 2, 4}) {
    for (int M : {1, 3, 8}) {
      std::vector<std::vector<Action>> fwd, steps;
      for (int r = 0; r < P; ++r) {
        fwd.push_back(make_forward_only(P, M, 2, r, Placement::kV));
        steps.push_back(make_schedule(ScheduleKind::kZbV, P, M, 2, r));
      }
      EXPECT_TRUE(simulate(fwd, P, 2, 0.5, 1.0, Placement::kV).deadlock_free) << P << " " << M;
      const Simulation sim = simulate(steps, P, 2, 0.5, 1.0, Placement::kV);
      EXPECT_TRUE(sim.deadlock_free) << P << " " << M;
      // The V's lists on the loop's placement are refused.
      if (P > 1) {
        EXPECT_THROW(simulate(steps, P, 2, 0.5, 1.0, Placement::kLoop), std::invalid_argument);
      }
    }
  }
  EXPECT_EQ(error_of<std::invalid_argument>([] { make_schedule(ScheduleKind::kZbV, 2, 4, 1, 0); }),
            "zbv runs two chunks per rank (a V); V = 1");
}

// B's whose W has not run hold their output gradients: the simulation
// counts the most at once per rank (0 without W actions).
TEST(Schedule, PeakWeightPending) {
  using K = Action::Kind;
  const std::vector<Action> one{{K::kForward, 0, 0}, {K::kBackward, 0, 0}, {K::kForward, 0, 1},
                                {K::kBackward, 0, 1}, {K::kWeight, 0, 0}, {K::kWeight, 0, 1}};
  EXPECT_EQ(simulate({one}, 1, 1).peak_weight_pending, (std::vector<int>{2}));
  EXPECT_EQ(simulate(all_ranks(ScheduleKind::kOneFOneB, 2, 4, 1), 2, 1).peak_weight_pending,
            (std::vector<int>{0, 0}));
  const Simulation h1 = simulate(all_ranks(ScheduleKind::kZbH1, 2, 4, 1), 2, 1);
  for (int r = 0; r < 2; ++r) {
    EXPECT_GE(h1.peak_weight_pending[r], 1) << r;
    EXPECT_LE(h1.peak_weight_pending[r], h1.peak_in_flight[r]) << r;
  }
}

TEST(Schedule, ArgumentErrors) {
  EXPECT_EQ(error_of<std::invalid_argument>(
                [] { make_schedule(ScheduleKind::kInterleaved, 4, 6, 2, 0); }),
            "interleaved_1f1b needs the micro-batch count to be a multiple of the pipeline "
            "size; M = 6, P = 4");
  EXPECT_EQ(
      error_of<std::invalid_argument>([] { make_schedule(ScheduleKind::kGPipe, 2, 4, 2, 0); }),
      "gpipe runs one chunk per rank; V = 2 needs interleaved_1f1b");
  EXPECT_THROW(make_schedule(ScheduleKind::kOneFOneB, 2, 4, 2, 0), std::invalid_argument);
  EXPECT_THROW(make_schedule(ScheduleKind::kOneFOneB, 0, 4, 1, 0), std::invalid_argument);
  EXPECT_THROW(make_schedule(ScheduleKind::kOneFOneB, 2, 0, 1, 0), std::invalid_argument);
  EXPECT_THROW(make_schedule(ScheduleKind::kInterleaved, 2, 4, 0, 0), std::invalid_argument);
  EXPECT_EQ(
      error_of<std::invalid_argument>([] { make_schedule(ScheduleKind::kOneFOneB, 2, 4, 1, 2); }),
      "pipeline rank 2 is outside [0, 2)");
  EXPECT_THROW(make_schedule(ScheduleKind::kGPipe, 2, 4, 1, -1), std::invalid_argument);
  EXPECT_THROW(make_forward_only(2, 4, 1, 5), std::invalid_argument);
}

// ---------------------------------------------------------------------------
// Stage message header
// ---------------------------------------------------------------------------

std::vector<TensorMeta> sample_metas() {
  return {
      {"x", 6, {}},                               // float, 0-d
      {"hidden", 15, {8}},                        // bfloat16, 1-d
      {std::string(40, 'n'), 5, {4, 1024}},       // half, 40-byte name
      {"mask", 11, {2, 1, 512}},                  // bool, 3-d
      {"kv_\xc3\xa9t\xc3\xa9", 4, {2, 3, 0, 5}},  // int64, empty dim, UTF-8 name
  };
}

TEST(StageMessage, RoundTrip) {
  const auto metas = sample_metas();
  for (std::int64_t gen :
       {std::int64_t{0}, std::int64_t{1}, std::int64_t{-3}, std::int64_t{1} << 40}) {
    const auto words = encode_header(metas, gen);
    EXPECT_EQ(words.size(), kHeaderWords);
    std::int64_t got = 12345;
    EXPECT_EQ(decode_header(words, &got), metas);
    EXPECT_EQ(got, gen);
  }
  // Each subset round-trips alone too (and the generation pointer is optional).
  for (const TensorMeta& m : metas) {
    EXPECT_EQ(decode_header(encode_header({m}, 2)), std::vector<TensorMeta>{m}) << m.name;
  }
  // Zero tensors.
  const auto empty = encode_header({}, 9);
  EXPECT_EQ(empty.size(), kHeaderWords);
  std::int64_t gen = 0;
  EXPECT_TRUE(decode_header(empty, &gen).empty());
  EXPECT_EQ(gen, 9);
}

TEST(StageMessage, Layout) {
  const auto w = encode_header({{"ab", 7, {3, 4}}}, 5);
  // magic, version, generation, count, dtype, ndim, dims, name length, bytes
  EXPECT_EQ(w[2], 5);
  EXPECT_EQ(w[3], 1);
  EXPECT_EQ((std::vector<std::int64_t>(w.begin() + 4, w.begin() + 11)),
            (std::vector<std::int64_t>{7, 2, 3, 4, 2, 'a', 'b'}));
  EXPECT_TRUE(std::all_of(w.begin() + 11, w.end(), [](std::int64_t x) { return x == 0; }));
  // A different generation changes only word 2.
  auto w2 = encode_header({{"ab", 7, {3, 4}}}, 6);
  w2[2] = 5;
  EXPECT_EQ(w, w2);
}

TEST(StageMessage, CapacityIsExact) {
  // One tensor of rank 0 takes 4 + 3 + name length words.
  const std::size_t fits = kHeaderWords - 7;
  EXPECT_EQ(encode_header({{std::string(fits, 'a'), 6, {}}}, 0).size(), kHeaderWords);
  EXPECT_EQ(decode_header(encode_header({{std::string(fits, 'a'), 6, {}}}, 0))[0].name.size(),
            fits);
  EXPECT_EQ(error_of<std::invalid_argument>([&] {
              encode_header({{std::string(fits + 1, 'a'), 6, {}}}, 0);
            }),
            "stage message header needs 513 int64 words for 1 tensors; the fixed capacity is "
            "512 (fewer tensors, shorter names or lower ranks fit)");
  std::vector<TensorMeta> many(60, TensorMeta{"activation", 6, {4, 4}});
  EXPECT_TRUE(contains(error_of<std::invalid_argument>([&] { encode_header(many, 0); }),
                       "needs 904 int64 words for 60 tensors"));
}

TEST(StageMessage, EncodeRejectsBadMetas) {
  EXPECT_EQ(error_of<std::invalid_argument>([] {
              encode_header({{"a", 6, {1}}, {"", 6, {}}}, 0);
            }),
            "stage message tensor 1 has an empty name");
  EXPECT_EQ(error_of<std::invalid_argument>([] {
              encode_header({{"h", 6, {4, -1}}}, 0);
            }),
            "stage message tensor 'h' has dimension 1 = -1; sizes must be >= 0");
}

TEST(StageMessage, DecodeRejectsCorruption) {
  const auto good = encode_header(sample_metas(), 3);
  auto decode_error = [](const std::vector<std::int64_t>& w) {
    std::int64_t gen = 42;
    std::string e = error_of<std::runtime_error>([&] { decode_header(w, &gen); });
    EXPECT_EQ(gen, 42) << "generation written on failure";
    return e;
  };

  auto w = good;
  w[0] ^= 1;
  EXPECT_TRUE(contains(decode_error(w), "bad magic"));
  EXPECT_TRUE(contains(decode_error(std::vector<std::int64_t>(kHeaderWords, 0)), "bad magic"));

  w = good;
  w[1] = 2;
  EXPECT_EQ(decode_error(w),
            "stage message header has unknown format version 2 (this build "
            "reads version 1)");

  // Truncated: the words stop inside the third tensor (its 40-byte name).
  w.assign(good.begin(), good.begin() + 30);
  EXPECT_TRUE(contains(decode_error(w), "truncated"));
  EXPECT_TRUE(contains(decode_error(w), "tensor 2"));
  EXPECT_TRUE(contains(decode_error(std::vector<std::int64_t>(good.begin(), good.begin() + 3)),
                       "truncated: it ends at word 3 while reading the tensor count"));

  // A count larger than what was encoded reads zero padding as a tensor
  // with an empty name.
  w = good;
  w[3] += 1;
  EXPECT_EQ(decode_error(w), "stage message header: tensor 5 has invalid name length 0");
  // Absurd and negative counts.
  w = good;
  w[3] = 1000;
  EXPECT_TRUE(contains(decode_error(w), "invalid tensor count 1000"));
  w[3] = -1;
  EXPECT_TRUE(contains(decode_error(w), "invalid tensor count -1"));

  // Tensor 0 starts at word 4: dtype, ndim.
  w = good;
  w[5] = -2;
  EXPECT_EQ(decode_error(w), "stage message header: tensor 0 has invalid rank -2");
  w[5] = 1 << 20;
  EXPECT_EQ(decode_error(w), "stage message header: tensor 0 has invalid rank 1048576");
  // Tensor 1 ("hidden", shape {8}) starts at word 4 + 3 + 1 = 8; its size at word 10.
  w = good;
  w[10] = -8;
  EXPECT_EQ(decode_error(w), "stage message header: tensor 1 has negative size -8 in dimension 0");
  w = good;
  w[12] = 300;  // first byte of "hidden"
  EXPECT_EQ(decode_error(w), "stage message header: tensor 1 has a name byte 300 outside 0..255");
  w = good;
  w[4] = std::int64_t{1} << 40;
  EXPECT_TRUE(contains(decode_error(w), "outside the int range"));

  // And the untouched header still decodes.
  EXPECT_EQ(decode_header(good), sample_metas());
}

TEST(StageMessage, Numel) {
  EXPECT_EQ(numel(TensorMeta{"s", 6, {}}), 1);
  EXPECT_EQ(numel(TensorMeta{"t", 6, {2, 3, 4}}), 24);
  EXPECT_EQ(numel(TensorMeta{"e", 6, {2, 0, 5}}), 0);
  EXPECT_EQ(numel(TensorMeta{"big", 6, {1 << 20, 1 << 20}}), std::int64_t{1} << 40);
}

}  // namespace
}  // namespace hp::pipeline
