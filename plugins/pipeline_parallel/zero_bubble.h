#pragma once
// Zero-bubble pipeline schedules (Qi et al., ICLR 2024) as a timed plan:
// the backward of a chunk split into B (the gradient of its input, on the
// critical path) and W (the gradient of its weights, deferrable), and the
// bubble filled with W. This file builds and times the per-rank op lists
// for 1F1B (B and W fused, the baseline), ZB-H1 (1F1B's activation memory)
// and ZB-V (two chunks per rank in a V: rank r holds chunks r and 2P-1-r),
// given the costs of F, B and W. It is the simulator behind the figures,
// and schedule zb_h1's lists are its ZB-H1 plan (make_schedule); ZB-V is
// simulated only (the executor does not place chunks in a V yet). No
// LibTorch here.
//
// Each schedule is built by greedy list scheduling over all ranks in time
// order. A free rank picks among the ops whose inputs are done: 1F1B a B
// first (the earliest ready), else an F while its activations between F
// and B stay within P - rank micro-batches of a stage (PipeDream-Flush's
// warm-up; this reproduces make_schedule's 1f1b lists exactly); the
// zero-bubble schemes an F first, under the same gate (ZB-V: P) and with
// activations between F and W within P (1F1B's peak), else a B, else the
// oldest pending W: the W's fill the bubbles. ZB-H1 built so gives its
// formula, (P-1)(F+B-W) of idle per rank, at 1F1B's peak memory.
// Otherwise the rank waits for the next op to finish anywhere.
// Dependencies: F(c, m) after F(c-1, m); B(c, m) after F(c, m) and
// B(c+1, m); W(c, m) after B(c, m). Communication is free.
#include <string>
#include <vector>

namespace hp::pipeline::zb {

enum class Scheme { kOneFOneB, kZbH1, kZbV };

/// "1f1b", "zb_h1", "zbv" -> scheme; throws std::invalid_argument otherwise.
Scheme parse_scheme(const std::string& name);
const char* to_string(Scheme s);

struct Costs {
  double f = 1, b = 1, w = 1;
};

struct Op {
  enum class Kind { kF, kB, kW } kind;
  int chunk = 0, mb = 0;
  double start = 0, finish = 0;
  std::string str() const;  ///< "F3.1", "B0.2", "W0.2" (1F1B's fused backward is "B")
};

struct Plan {
  Scheme scheme = Scheme::kOneFOneB;
  int P = 1, M = 1, V = 1;
  std::vector<std::vector<Op>> per_rank;  ///< each rank's ops in the order it runs them
  double makespan = 0;
  std::vector<double> idle_fraction;  ///< per rank: 1 - busy / makespan
  /// Per rank: most chunk activations held at once (F done, W not done),
  /// in units of one stage's activations (a ZB-V chunk is half a stage).
  std::vector<double> peak_activations;
  /// Idle time over P x makespan (the pipeline's bubble share).
  double idle() const;
};

/// The timed plan of `scheme` on P ranks and M micro-batches. Throws
/// std::invalid_argument for P < 1, M < 1, or a cost <= 0.
Plan plan(Scheme scheme, int P, int M, Costs costs = {});

/// One line per rank: its ops in order, for a dry run.
std::string table(const Plan& plan);

}  // namespace hp::pipeline::zb
