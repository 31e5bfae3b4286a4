// Contiguous min-max partitioning of a block list (see partition.h).
#include "plugins/pipeline_parallel/partition.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

namespace hp::pipeline {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// seg(i, j) = costs[i] + ... + costs[j - 1], always summed left to right so
// that the same range yields bit-identical values wherever it is used (the DP
// compares sums against the optimum for equality).
class SegmentCosts {
 public:
  explicit SegmentCosts(const std::vector<double>& costs)
      : n_(static_cast<int>(costs.size())), table_(static_cast<std::size_t>(n_ + 1) * (n_ + 1)) {
    for (int i = 0; i <= n_; ++i) {
      double sum = 0;
      at(i, i) = 0;
      for (int j = i + 1; j <= n_; ++j) {
        sum += costs[j - 1];
        at(i, j) = sum;
      }
    }
  }
  double operator()(int i, int j) const { return table_[index(i, j)]; }

 private:
  std::size_t index(int i, int j) const { return static_cast<std::size_t>(i) * (n_ + 1) + j; }
  double& at(int i, int j) { return table_[index(i, j)]; }
  int n_;
  std::vector<double> table_;
};

void check_costs(const std::vector<double>& costs) {
  for (std::size_t i = 0; i < costs.size(); ++i) {
    if (!(costs[i] >= 0) || std::isinf(costs[i])) {  // also rejects NaN
      std::ostringstream os;
      os << "block " << i << " has cost " << costs[i] << ": block costs must be finite and >= 0.";
      throw PartitionError(os.str());
    }
  }
}

void check_chunks(int blocks, int chunks) {
  if (chunks < 1) {
    throw PartitionError("the pipeline needs at least 1 chunk; " + std::to_string(chunks) +
                         " were asked for.");
  }
  if (chunks > blocks) {
    throw PartitionError(std::to_string(chunks) + " pipeline chunks need at least " +
                         std::to_string(chunks) + " blocks (one per chunk); the model has " +
                         std::to_string(blocks) + ".");
  }
}

Partition from_first(const std::vector<int>& first, const SegmentCosts& seg) {
  Partition p;
  p.first = first;
  for (std::size_t c = 0; c + 1 < first.size(); ++c) p.cost.push_back(seg(first[c], first[c + 1]));
  return p;
}

}  // namespace

double Partition::max_cost() const {
  double m = 0;
  for (double c : cost) m = std::max(m, c);
  return m;
}

std::string Partition::describe() const {
  std::ostringstream os;
  os.precision(3);  // "1.2e+06", "37.5"
  for (int c = 0; c < chunks(); ++c) {
    if (c > 0) os << " | ";
    const int lo = first[c], hi = first[c + 1] - 1;
    os << "chunk " << c << ": ";
    if (lo == hi) {
      os << "block " << lo;
    } else {
      os << "blocks " << lo << "-" << hi;
    }
    os << " (cost " << cost[c] << ")";
  }
  return os.str();
}

// Two exact dynamic programmes over suffixes (blocks [i, n) split into k chunks):
//
//  1. best[k][i] = the smallest achievable maximum chunk cost. best[chunks][0]
//     is the optimum `bound`.
//  2. Many splits usually reach `bound` (e.g. 10 equal blocks into 4 chunks:
//     1+3+3+3, 3+3+3+1, 2+2+3+3, ...). Among them we take the most even one:
//     minimal sum of squared chunk costs, subject to every chunk costing at
//     most `bound` (sq[k][i]). A per-chunk constraint and an additive objective
//     keep this an exact DP.
//  3. Remaining ties go to the lexicographically smallest boundaries
//     (`first`): reconstruction walks from block 0 and ends each chunk at the
//     earliest block that still attains the optimum. Earlier chunks therefore
//     come out no heavier than later ones on ties — the first pipeline stages
//     hold the most in-flight activations under 1F1B.
//
// O(chunks * n^2) time, O(n^2) memory (the segment table); n is a few hundred
// blocks at most in practice.
Partition partition_balanced(const std::vector<double>& costs, int chunks) {
  const int n = static_cast<int>(costs.size());
  check_chunks(n, chunks);
  check_costs(costs);
  const SegmentCosts seg(costs);

  // best[k][i], k = 0..chunks; best[0][n] = 0, anything else infeasible.
  std::vector<std::vector<double>> best(chunks + 1, std::vector<double>(n + 1, kInf));
  best[0][n] = 0;
  for (int k = 1; k <= chunks; ++k) {
    // Chunk [i, j) is followed by k - 1 non-empty chunks, so j <= n - (k - 1).
    for (int i = 0; i + k <= n; ++i) {
      double b = kInf;
      for (int j = i + 1; j <= n - (k - 1); ++j) {
        b = std::min(b, std::max(seg(i, j), best[k - 1][j]));
      }
      best[k][i] = b;
    }
  }
  const double bound = best[chunks][0];

  // sq[k][i]: least sum of squared chunk costs over splits of [i, n) into k
  // chunks each costing <= bound. Feasible wherever best[k][i] <= bound.
  std::vector<std::vector<double>> sq(chunks + 1, std::vector<double>(n + 1, kInf));
  sq[0][n] = 0;
  for (int k = 1; k <= chunks; ++k) {
    for (int i = 0; i + k <= n; ++i) {
      double s = kInf;
      for (int j = i + 1; j <= n - (k - 1) && seg(i, j) <= bound; ++j) {
        s = std::min(s, seg(i, j) * seg(i, j) + sq[k - 1][j]);
      }
      sq[k][i] = s;
    }
  }

  // Reconstruct: the earliest end j whose value equals the DP minimum. The
  // candidate expressions are recomputed exactly as in the DP, so the equality
  // is exact in floating point.
  std::vector<int> first{0};
  int i = 0;
  for (int k = chunks; k >= 1; --k) {
    int chosen = -1;
    for (int j = i + 1; j <= n - (k - 1) && seg(i, j) <= bound; ++j) {
      if (seg(i, j) * seg(i, j) + sq[k - 1][j] == sq[k][i]) {
        chosen = j;
        break;
      }
    }
    // Unreachable: sq[k][i] is finite and attained by some j in the range.
    if (chosen < 0) throw std::logic_error("partition_balanced: reconstruction failed");
    first.push_back(chosen);
    i = chosen;
  }
  return from_first(first, seg);
}

Partition partition_manual(const std::vector<double>& costs, const std::vector<int>& counts,
                           int chunks) {
  const int n = static_cast<int>(costs.size());
  if (chunks < 1) check_chunks(n, chunks);
  if (static_cast<int>(counts.size()) != chunks) {
    throw PartitionError("balance has " + std::to_string(counts.size()) +
                         " entries; the pipeline has " + std::to_string(chunks) +
                         " chunks (one entry per chunk).");
  }
  long long total = 0;
  for (std::size_t c = 0; c < counts.size(); ++c) {
    if (counts[c] < 1) {
      throw PartitionError("balance[" + std::to_string(c) + "] = " + std::to_string(counts[c]) +
                           ": every pipeline chunk needs at least one block.");
    }
    total += counts[c];
  }
  if (total != n) {
    throw PartitionError("balance lists " + std::to_string(total) + " blocks; the model has " +
                         std::to_string(n) + ".");
  }
  check_costs(costs);
  const SegmentCosts seg(costs);
  std::vector<int> first{0};
  for (int c : counts) first.push_back(first.back() + c);
  return from_first(first, seg);
}

}  // namespace hp::pipeline
