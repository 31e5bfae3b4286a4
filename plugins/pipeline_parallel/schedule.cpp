// Pipeline schedules as per-rank action lists, and a discrete-event
// simulator to check them (see schedule.h).
#include "plugins/pipeline_parallel/schedule.h"
#include "plugins/pipeline_parallel/zero_bubble.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

namespace hp::pipeline {
namespace {

Action fwd(int chunk, int mb) { return Action{Action::Kind::kForward, chunk, mb}; }
Action bwd(int chunk, int mb) { return Action{Action::Kind::kBackward, chunk, mb}; }

void check_layout(int P, int M, int V, int rank) {
  if (P < 1)
    throw std::invalid_argument("pipeline size P = " + std::to_string(P) + " must be >= 1");
  if (M < 1) {
    throw std::invalid_argument("micro-batch count M = " + std::to_string(M) + " must be >= 1");
  }
  if (V < 1) {
    throw std::invalid_argument("chunks per rank V = " + std::to_string(V) + " must be >= 1");
  }
  if (rank < 0 || rank >= P) {
    throw std::invalid_argument("pipeline rank " + std::to_string(rank) + " is outside [0, " +
                                std::to_string(P) + ")");
  }
}

std::vector<Action> gpipe(int M, int rank) {
  std::vector<Action> out;
  out.reserve(2 * static_cast<std::size_t>(M));
  for (int m = 0; m < M; ++m) out.push_back(fwd(rank, m));
  for (int m = 0; m < M; ++m) out.push_back(bwd(rank, m));  // ascending, like the forwards
  return out;
}

std::vector<Action> one_f_one_b(int P, int M, int rank) {
  std::vector<Action> out;
  out.reserve(2 * static_cast<std::size_t>(M));
  const int warmup = std::min(P - rank - 1, M);
  int next_f = 0, next_b = 0;
  while (next_f < warmup) out.push_back(fwd(rank, next_f++));
  while (next_f < M) {  // steady state: one forward, one backward
    out.push_back(fwd(rank, next_f++));
    out.push_back(bwd(rank, next_b++));
  }
  while (next_b < M) out.push_back(bwd(rank, next_b++));  // cool-down
  return out;
}

// Megatron-LM's interleaved 1F1B. The rank runs M * V forwards and as many
// backwards. The k-th forward (k = 0 .. M V - 1) works on micro-batches in
// groups of P: P micro-batches go through chunk-slot 0, the same P through
// slot 1, ..., slot V - 1, then the next P micro-batches start again at slot 0.
//   slot(k) = (k / P) % V          global chunk = slot * P + rank
//   mb(k)   = (k / (P V)) P + k % P
// The k-th backward uses the same micro-batch and the mirrored slot
// V - 1 - (k / P) % V (gradients flow from the last chunk to the first).
// The warm-up is (P - rank - 1) * 2 + (V - 1) * P forwards (capped at M V):
// enough that rank 0 keeps running forwards until the first gradient has
// made the round trip back to it.
std::vector<Action> interleaved(int P, int M, int V, int rank) {
  const int total = M * V;
  auto chunk_of = [&](int k, bool forward) {
    const int slot = (k / P) % V;
    return (forward ? slot : V - 1 - slot) * P + rank;
  };
  auto mb_of = [&](int k) { return (k / (P * V)) * P + k % P; };

  const int warmup = std::min((P - rank - 1) * 2 + (V - 1) * P, total);
  std::vector<Action> out;
  out.reserve(2 * static_cast<std::size_t>(total));
  int next_f = 0, next_b = 0;
  while (next_f < warmup) {
    out.push_back(fwd(chunk_of(next_f, true), mb_of(next_f)));
    ++next_f;
  }
  while (next_f < total) {
    out.push_back(fwd(chunk_of(next_f, true), mb_of(next_f)));
    ++next_f;
    out.push_back(bwd(chunk_of(next_b, false), mb_of(next_b)));
    ++next_b;
  }
  while (next_b < total) {
    out.push_back(bwd(chunk_of(next_b, false), mb_of(next_b)));
    ++next_b;
  }
  return out;
}

}  // namespace

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::kOneFOneB;
  if (name == "interleaved_1f1b") return ScheduleKind::kInterleaved;
  if (name == "zb_h1") return ScheduleKind::kZbH1;
  if (name == "zbv") return ScheduleKind::kZbV;
  throw std::invalid_argument("unknown pipeline schedule '" + name +
                              "'; expected gpipe, 1f1b, interleaved_1f1b, zb_h1 or zbv");
}

const char* to_string(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::kOneFOneB:
      return "1f1b";
    case ScheduleKind::kInterleaved:
      return "interleaved_1f1b";
    case ScheduleKind::kZbH1:
      return "zb_h1";
    case ScheduleKind::kZbV:
      return "zbv";
  }
  return "?";
}

Placement placement_of(ScheduleKind k) { return k == ScheduleKind::kZbV ? Placement::kV : Placement::kLoop; }

int chunks_per_rank(ScheduleKind k, int virtual_stages) {
  return k == ScheduleKind::kZbV ? 2 : virtual_stages;
}

int rank_of_chunk(Placement pl, int P, int V, int chunk) {
  if (pl == Placement::kV && V == 2) return chunk < P ? chunk : 2 * P - 1 - chunk;
  return chunk % P;
}

std::vector<int> chunks_of_rank(Placement pl, int P, int V, int rank) {
  std::vector<int> out;
  for (int c = 0; c < P * V; ++c)
    if (rank_of_chunk(pl, P, V, c) == rank) out.push_back(c);
  return out;
}

std::string Action::str() const {
  const char* k = kind == Kind::kForward ? "F" : kind == Kind::kBackward ? "B" : "W";
  return k + std::to_string(chunk) + "." + std::to_string(mb);
}

std::vector<Action> make_schedule(ScheduleKind kind, int P, int M, int V, int rank, ActionCosts costs) {
  check_layout(P, M, V, rank);
  if (kind == ScheduleKind::kZbV && V != 2) {
    throw std::invalid_argument("zbv runs two chunks per rank (a V); V = " + std::to_string(V));
  }
  if (V > 1 && kind != ScheduleKind::kInterleaved && kind != ScheduleKind::kZbV) {
    throw std::invalid_argument(std::string(to_string(kind)) + " runs one chunk per rank; V = " +
                                std::to_string(V) + " needs interleaved_1f1b");
  }
  switch (kind) {
    case ScheduleKind::kZbH1:
    case ScheduleKind::kZbV: {
      std::vector<Action> out;
      const zb::Plan plan = zb::plan(kind == ScheduleKind::kZbV ? zb::Scheme::kZbV : zb::Scheme::kZbH1, P, M,
                                     zb::Costs{costs.f, costs.b, costs.w});
      for (const zb::Op& op : plan.per_rank.at(static_cast<std::size_t>(rank))) {
        const Action::Kind k = op.kind == zb::Op::Kind::kF   ? Action::Kind::kForward
                               : op.kind == zb::Op::Kind::kB ? Action::Kind::kBackward
                                                             : Action::Kind::kWeight;
        out.push_back({k, op.chunk, op.mb});
      }
      return out;
    }
    case ScheduleKind::kGPipe:
      return gpipe(M, rank);
    case ScheduleKind::kOneFOneB:
      return one_f_one_b(P, M, rank);
    case ScheduleKind::kInterleaved:
      // With one chunk per rank nothing interleaves; like Megatron-LM, run
      // the plain 1F1B schedule (its warm-up formula would otherwise double
      // the warm-up for no gain).
      if (V == 1) return one_f_one_b(P, M, rank);
      if (M % P != 0) {
        throw std::invalid_argument(
            "interleaved_1f1b needs the micro-batch count to be a "
            "multiple of the pipeline size; M = " +
            std::to_string(M) + ", P = " + std::to_string(P));
      }
      return interleaved(P, M, V, rank);
  }
  throw std::invalid_argument("unknown schedule kind");
}

// Forwards in groups of P micro-batches, each group through all of the
// rank's chunk-slots in turn (Megatron's interleaved forward order; the last
// group may be smaller when P does not divide M). For V == 1 this is simply
// micro-batches 0 .. M-1. Plain (micro-batch, chunk) order would be correct
// too but serialises the pipeline when V > 1: rank 0 would wait for every
// micro-batch's round trip through all P ranks before starting the next one.
std::vector<Action> make_forward_only(int P, int M, int V, int rank, Placement pl) {
  check_layout(P, M, V, rank);
  const std::vector<int> mine = chunks_of_rank(pl, P, V, rank);
  std::vector<Action> out;
  for (int group = 0; group < M; group += P) {
    const int end = std::min(group + P, M);
    for (int c : mine) {
      for (int m = group; m < end; ++m) out.push_back(fwd(c, m));
    }
  }
  return out;
}

// As-soon-as-possible list scheduling. Each rank runs its list strictly in
// order; an action starts at max(time its rank becomes free, time its inputs
// are finished). Because communication is free and a start time depends only
// on already-finished actions, the order in which ranks are advanced does not
// change the result: we sweep over the ranks, advancing each as far as its
// inputs allow, until every list is done or a full sweep makes no progress
// (a deadlock: every unfinished rank waits on an action that can never run).
Simulation simulate(const std::vector<std::vector<Action>>& per_rank, int P, int V,
                    double forward_cost, double backward_cost, Placement pl) {
  if (P < 1 || V < 1) throw std::invalid_argument("simulate: P and V must be >= 1");
  if (static_cast<int>(per_rank.size()) != P) {
    throw std::invalid_argument("simulate: " + std::to_string(per_rank.size()) +
                                " action lists for " + std::to_string(P) + " ranks");
  }
  const int chunks = P * V;
  for (int r = 0; r < P; ++r) {
    for (const Action& a : per_rank[r]) {
      if (a.chunk < 0 || a.chunk >= chunks || rank_of_chunk(pl, P, V, a.chunk) != r || a.mb < 0) {
        throw std::invalid_argument("simulate: action " + a.str() + " does not belong on rank " +
                                    std::to_string(r) + " of " + std::to_string(P));
      }
    }
  }

  Simulation sim;
  sim.peak_in_flight.assign(P, 0);
  // With W actions a backward is B + W, each half its cost, and a chunk's
  // activations are held until its W (what W needs stays alive).
  bool split = false;
  for (const auto& list : per_rank)
    for (const Action& a : list) split = split || a.kind == Action::Kind::kWeight;
  const Action::Kind releases = split ? Action::Kind::kWeight : Action::Kind::kBackward;
  sim.peak_weight_pending.assign(P, 0);
  for (int r = 0; r < P; ++r) {
    int in_flight = 0, pending = 0;
    for (const Action& a : per_rank[r]) {
      if (a.kind == Action::Kind::kForward) ++in_flight;
      if (a.kind == releases) --in_flight;
      if (split && a.kind == Action::Kind::kBackward) ++pending;
      if (a.kind == Action::Kind::kWeight) --pending;
      sim.peak_in_flight[r] = std::max(sim.peak_in_flight[r], in_flight);
      sim.peak_weight_pending[r] = std::max(sim.peak_weight_pending[r], pending);
    }
  }

  // Finish time of every action that has run, keyed by (kind, chunk, mb).
  using Key = std::tuple<int, int, int>;
  std::map<Key, double> done;
  auto key = [](Action::Kind k, int chunk, int mb) {
    return Key{static_cast<int>(k), chunk, mb};
  };
  // Time at which all inputs of `a` are ready, or a negative value if some
  // input has not run yet.
  auto ready_time = [&](const Action& a) {
    double t = 0;
    auto need = [&](Action::Kind k, int chunk) {
      auto it = done.find(key(k, chunk, a.mb));
      if (it == done.end()) return false;
      t = std::max(t, it->second);
      return true;
    };
    if (a.kind == Action::Kind::kForward) {
      if (a.chunk > 0 && !need(Action::Kind::kForward, a.chunk - 1)) return -1.0;
    } else if (a.kind == Action::Kind::kWeight) {
      if (!need(Action::Kind::kBackward, a.chunk)) return -1.0;
    } else {
      if (!need(Action::Kind::kForward, a.chunk)) return -1.0;
      if (a.chunk < chunks - 1 && !need(Action::Kind::kBackward, a.chunk + 1)) return -1.0;
    }
    return t;
  };

  std::vector<std::size_t> next(P, 0);
  std::vector<double> free_at(P, 0.0), busy(P, 0.0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < P; ++r) {
      while (next[r] < per_rank[r].size()) {
        const Action& a = per_rank[r][next[r]];
        const double ready = ready_time(a);
        if (ready < 0) break;
        const double cost = a.kind == Action::Kind::kForward ? forward_cost
                            : split                          ? backward_cost / 2
                                                             : backward_cost;
        const double finish = std::max(free_at[r], ready) + cost;
        done[key(a.kind, a.chunk, a.mb)] = finish;
        free_at[r] = finish;
        busy[r] += cost;
        ++next[r];
        progress = true;
      }
    }
  }
  for (int r = 0; r < P; ++r) {
    if (next[r] < per_rank[r].size()) return sim;  // deadlock: makespan 0, no idle figures
  }
  sim.deadlock_free = true;
  sim.makespan = *std::max_element(free_at.begin(), free_at.end());
  for (int r = 0; r < P; ++r) {
    sim.idle_fraction.push_back(sim.makespan > 0 ? 1.0 - busy[r] / sim.makespan : 0.0);
  }
  return sim;
}

}  // namespace hp::pipeline
