#pragma once
// Pipeline schedules as plain action lists, one list per rank.
// No LibTorch here: pure logic, unit-tested on its own.
//
// Layout: the model is split into P * V chunks (V = virtual stages per rank,
// 1 for gpipe and 1f1b, 2 for zbv). Chunk c lives on pipeline rank c % P
// (a loop: rank r owns chunks r, r + P, r + 2P, ...), except under zbv,
// whose two chunks per rank make a V: rank r owns chunks r and 2P - 1 - r,
// so the first and the last chunk share rank 0 and chunk P - 1 hands over
// to chunk P on the same rank. Micro-batches are 0 .. M-1.
//
// A rank's list holds only its COMPUTE actions, in the order it runs them:
//   Forward(chunk, mb)  : needs the output of Forward(chunk - 1, mb) (if chunk > 0)
//   Backward(chunk, mb) : needs Backward(chunk + 1, mb) (if chunk < P*V - 1), and its
//                         own Forward(chunk, mb)
// Communication is implied: the executor receives before a compute action
// that needs another rank's result and sends (non-blocking) after one whose
// result another rank needs.
#include <string>
#include <vector>

namespace hp::pipeline {

enum class ScheduleKind { kGPipe, kOneFOneB, kInterleaved, kZbH1, kZbV };

/// "gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zbv" -> kind; throws std::invalid_argument otherwise.
ScheduleKind parse_schedule(const std::string& name);
const char* to_string(ScheduleKind k);

/// Where chunks live: a loop (chunk c on rank c % P) or a V (zbv).
enum class Placement { kLoop, kV };
Placement placement_of(ScheduleKind k);
/// Chunks per rank a schedule runs: zbv 2, the others `virtual_stages`.
int chunks_per_rank(ScheduleKind k, int virtual_stages);
/// The rank that runs chunk `chunk` of P * V.
int rank_of_chunk(Placement pl, int P, int V, int chunk);
/// The chunks rank `rank` runs, ascending (its chunk-slots in model order).
std::vector<int> chunks_of_rank(Placement pl, int P, int V, int rank);

struct Action {
  /// kBackward: the whole backward, or B alone (the input's gradient) in a
  /// schedule with kWeight actions; kWeight: W, the weights' gradients of a
  /// chunk and micro-batch whose B ran (zb_h1).
  enum class Kind { kForward, kBackward, kWeight } kind;
  int chunk;  ///< global chunk index in [0, P*V)
  int mb;     ///< micro-batch
  bool operator==(const Action& o) const { return kind == o.kind && chunk == o.chunk && mb == o.mb; }
  std::string str() const;  ///< "F3.1" = forward of chunk 3, micro-batch 1; "B0.2"; "W0.2"
};

/// The action list of pipeline rank `rank` of `P`, with `M` micro-batches and
/// `V` chunks per rank.
///  gpipe:  all forwards (mb 0..M-1), then all backwards in the same ascending
///          order (mb 0..M-1; not reversed).
///  1f1b:   warm-up of min(P - rank - 1, M) forwards, then alternate one
///          forward and one backward, then the remaining backwards
///          (PipeDream-Flush / Megatron's non-interleaved schedule).
///  interleaved_1f1b (Megatron): forwards visit the rank's chunks in groups of
///          P micro-batches (k-th forward: chunk-slot (k / P) % V, mb
///          (k / (P V)) P + k % P); backwards the same with chunk-slots
///          reversed; warm-up (P - rank - 1) * 2 + (V - 1) * P forwards
///          (capped at M V), then 1F1B, then cool-down. Requires M % P == 0.
///          With V == 1 nothing interleaves and, as in Megatron-LM, the list
///          is exactly the 1f1b one (no M % P requirement then).
///  zb_h1:  zero-bubble H1 (zero_bubble.h's plan with equal F, B and W
///          costs): F, B and W actions; each rank defers its W's into the
///          bubble at 1F1B's peak activations. V must be 1.
///  zbv:    zero-bubble V (zero_bubble.h's ZB-V plan, equal costs): two
///          chunks per rank in a V, F, B and W actions. V must be 2.
/// Throws std::invalid_argument for P < 1, M < 1, V < 1, rank outside [0, P),
/// V > 1 with a kind other than interleaved or zbv, zbv with V != 2, or
/// interleaved with V > 1 and M % P != 0.
/// Costs of a forward, a B and a W (any unit) that the zero-bubble plans
/// are built for (zb_h1, zbv); other kinds ignore them.
struct ActionCosts {
  double f = 1, b = 1, w = 1;
};
std::vector<Action> make_schedule(ScheduleKind kind, int P, int M, int V, int rank,
                                  ActionCosts costs = {});

/// Forward-only list (evaluation): every forward of the rank's chunks, in
/// groups of P micro-batches, each group through chunk-slot 0, 1, ..., V-1 in
/// turn (Megatron's interleaved forward order; the last group is smaller when
/// P does not divide M). For V == 1 that is mb 0..M-1. (Plain (mb, chunk) order
/// would serialise the pipeline for V > 1.) Same argument checks as above.
/// The chunk-slots are `pl`'s (a V: chunk rank, then chunk 2P - 1 - rank).
std::vector<Action> make_forward_only(int P, int M, int V, int rank,
                                      Placement pl = Placement::kLoop);

/// Runs all P lists against each other in discrete time (each action costs
/// `forward_cost` or `backward_cost` time units; an action starts when its
/// rank is free and its inputs are ready; communication is free). Returns
/// false in `deadlock_free` if some rank can never proceed (then makespan is 0
/// and idle_fraction empty; peak_in_flight is always filled). Dependencies
/// are those listed at the top of this file. Throws std::invalid_argument
/// when per_rank.size() != P or an action's chunk is not one of its rank's.
/// Used by tests
/// and by the benchmark to print the theoretical idle fraction of a
/// schedule (idle time / (P * makespan)).
struct Simulation {
  bool deadlock_free = false;
  double makespan = 0;
  std::vector<double> idle_fraction;     ///< per rank: 1 - busy / makespan
  /// Per rank: most chunks whose B ran and whose W has not (their output
  /// gradients wait in W's queue); 0 without W actions.
  std::vector<int> peak_weight_pending;
  std::vector<int> peak_in_flight;       ///< per rank: most micro-batch chunks
                                         ///< forwarded but not yet backwarded
};
Simulation simulate(const std::vector<std::vector<Action>>& per_rank, int P, int V,
                    double forward_cost = 1.0, double backward_cost = 2.0,
                    Placement pl = Placement::kLoop);

}  // namespace hp::pipeline
