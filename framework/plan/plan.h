#pragma once
// The layout planner's estimates (hp-plan, hp-train --dry-run): what a rank
// of a layout holds and how long its step takes, predicted before any
// process starts.
//
// Every rank's model is built on the meta device in a planning context (its
// place in the mesh, no process group): the features install as they would
// and say, through the interfaces they already implement, which blocks the
// rank builds and at which local shapes (placements), what the optimizer
// keeps between steps (Optimizer::model_state) and the step's shape
// (StepExecutor::shape: micro-batches in flight, the schedule's idle share).
// So the model state is exact, not a formula of feature names.
//
// Activations and compute time come from a calibration of the model's own
// blocks at one process (real tensors, one micro-batch): bytes each block
// keeps for its backward and its forward + backward seconds, per token,
// at one thread and at every core. A layout scales them by what a rank
// holds of each block (its share of the block's parameters over split
// dimensions, its share of the positions over sequence dimensions) and by
// the cores its ranks share. Communication: the bytes each collective of
// the step moves (derived from placements: gradient sums over partial
// dimensions, the split blocks' activation sums, stage messages) over the
// machine's measured copy bandwidth.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "framework/runtime/setup.h"

namespace hp::plan {

/// A member's slot in a group's shared-memory segment (the collectives of
/// ranks on one host; backends/comm's ShmCollectives::kSlotBytes, which
/// ut.Planner holds it to): the largest piece sent at once.
constexpr double kShmSlotBytes = 2.0 * 1024 * 1024;

/// What the calibration measured (cached per machine and model).
struct Calibration {
  std::string key;  ///< what it was measured for (machine, model, micro-batch)
  /// Resident memory of a rank that loaded LibTorch and the plugins and
  /// built nothing (a fork of the planning process, as hp-launch forks).
  double baseline_bytes = 0;
  /// An all-reduce between two ranks of this machine: its latency (s) and
  /// the bytes per second beyond it.
  double collective_latency_s = 0;
  double collective_bytes_per_s = 0;
  /// Its bytes per second beyond the first 4 MiB (measured at 64 MiB: out
  /// of the caches, as gradient buckets are).
  double collective_large_bytes_per_s = 0;
  /// What such a sum costs beyond that when issued between computations
  /// (waiting for the peer, the hand-over to the communication thread).
  double collective_in_step_s = 0;
  /// A message from one rank to another (send and receive): latency (s)
  /// and bytes per second.
  double p2p_latency_s = 0, p2p_bytes_per_s = 0;
  /// A collective between products with two one-thread ranks per core, as
  /// collective_in_step_s (ranks waiting for peers that wait for a core).
  double shared_core_collective_s = 0;
  /// A ring exchange (send to the next member, receive from the previous)
  /// posted before a product and waited for after it: the seconds it adds
  /// to the product, for a message of ring_step_bytes.
  double ring_step_s = 0, ring_step_bytes = 0;
  /// A bf16 sum between two ranks over an fp32 one of as many elements
  /// (ours exchanges the bf16 parts and sums them in fp32 on each member).
  double collective_bf16_sum_factor = 1;
  /// Attention: the model's own (model.attention as one process runs it)
  /// forward + backward seconds per token of the calibrated micro-batch,
  /// and attention by score blocks, {block length, forward + backward
  /// seconds per block of one head} at a few lengths, at 1 thread (every
  /// core busy) and at `cores` threads. A sequence layout that computes
  /// its attention by blocks (context parallel's ring) replaces the one
  /// with the other. Empty / 0 for a model without attention.
  double attention_core_seconds_per_token_1 = 0, attention_core_seconds_per_token_all = 0;
  std::vector<std::vector<double>> attention_block_seconds_1, attention_block_seconds_all;
  /// The start-up probe's product rate (FLOP/s) at 1 thread and at `cores`.
  double gemm_flops_per_s_1 = 0, gemm_flops_per_s_all = 0;
  int cores = 1;
  /// Per block of the model (model order), then the loss block last:
  /// activation bytes kept for backward per token, and forward + backward
  /// seconds per token at 1 thread and at `cores` threads.
  std::vector<double> act_bytes_per_token;
  std::vector<double> seconds_per_token_1;
  /// The same at 1 thread for a micro-batch of half the positions (each
  /// sample's first seq_len / 2), timed in the same steps: a layout that
  /// splits the positions runs its blocks on fewer tokens, which cost more
  /// each (what a call costs whatever its size). Empty when not timed.
  std::vector<double> seconds_per_token_half_positions_1;
  std::vector<double> seconds_per_token_all;
  /// Most bytes the backward needs beyond the activations, per token of one
  /// micro-batch (gradients of activations in flight), at one process.
  double backward_extra_per_token = 0;
  /// The step's end: the passes over the gradients (zeroing, norm, clip)
  /// per gradient byte, and the optimizer's update per byte of its state,
  /// at 1 thread (every core busy) and at `cores` threads.
  double grad_pass_seconds_per_byte_1 = 0, grad_pass_seconds_per_byte_all = 0;
  double update_seconds_per_byte_1 = 0, update_seconds_per_byte_all = 0;
  /// A MoE: per block (as seconds_per_token_*), the part of its seconds per
  /// token its routed experts' products take (0 for other blocks); and for
  /// each group count G dividing the experts, {G, the most loaded group's
  /// rows over the mean group's} under the calibration's routing.
  std::vector<double> expert_seconds_per_token_1, expert_seconds_per_token_all;
  std::vector<std::vector<double>> expert_group_imbalance;
  /// Per block: what the first micro-batch after an update takes beyond
  /// the others (a MoE repacks its experts' weights once a step), seconds
  /// per token of the calibrated micro-batch, at 1 thread and at `cores`.
  std::vector<double> first_micro_batch_extra_1, first_micro_batch_extra_all;
  /// One-thread processes two per core against one per core: the time factor.
  double two_per_core_factor = 2;
  /// What a process holds at its peak besides its model state and
  /// activations (code paged in, thread stacks, the start-up probe).
  double process_extra_bytes = 0;
  /// The peak's bytes per byte of gradient made whole in each backward (a
  /// process that releases its gradients after every update, against one
  /// that keeps them): their own bytes plus the gaps left where they are
  /// placed among the activations being freed.
  double grads_made_whole_factor = 1;
  /// The peak above start less the model state and the layers' kept
  /// copies, {tokens per micro-batch, bytes}, at half the micro-batch
  /// (when it has one), the micro-batch and twice it.
  std::vector<std::vector<double>> in_step_points;
  double seconds = 0;  ///< how long the calibration took

  std::string to_json() const;
  static Calibration from_json(const std::string& text);
};

/// The calibration's cache key for `setup` (model section, micro-batch,
/// sequence, the precision its features set, CPU, threads): the same key
/// reuses the cached measurements.
std::string calibration_key(const Setup& setup);
/// The cache file: $HP_PLAN_CACHE, or $XDG_CACHE_HOME (~/.cache)/hyperparallel/plan/<hash>.json.
std::string calibration_path(const Setup& setup);
/// Reads the cached calibration for `setup`; false when there is none.
bool load_calibration(const Setup& setup, Calibration& out);
/// For each group count G dividing the experts (G > 1): the mean over
/// `routed` (each one layer's tokens per expert in one micro-batch) of the
/// most loaded group's tokens over the mean group's, the groups contiguous
/// ranges of experts as an expert split places them. {G, factor} each.
std::vector<std::vector<double>> group_imbalance(const std::vector<std::vector<double>>& routed);
/// Measures (one process of the model in forked children, real tensors,
/// built under `setup`'s features as one rank installs them: a setup of
/// one process whose features split nothing; mixed precision's policy
/// applies) and caches. Call it before this process runs a parallel region.
Calibration calibrate(const Setup& setup);

/// One rank of a layout.
struct RankEstimate {
  int rank = 0;
  std::string coords;  ///< its mesh coordinates ("dp0 tp1")
  int blocks = 0;      ///< blocks it builds
  double params = 0, grads = 0, optimizer = 0;  ///< model state between steps
  double activations = 0;  ///< kept for backward at the step's peak
  double buffers = 0;      ///< gradient buckets and backward's extra
  double kept_copies = 0;  ///< what its layers keep beside their parameters (packed expert weights)
  double baseline = 0;
  double peak() const { return params + grads + optimizer + activations + buffers + kept_copies + baseline; }
  double model_state() const { return params + grads + optimizer; }
  // Step time (seconds)
  double compute = 0;  ///< its blocks' forward and backward, all micro-batches
  double idle = 0;     ///< the schedule's bubble
  double comm = 0;     ///< exposed communication
  double update = 0;   ///< the step's end: gradient norm and clip, the optimizer's update
  double in_flight = 1;
  double comm_bytes = 0;  ///< bytes it sends per step (all groups)
};

struct LayoutEstimate {
  int world = 0;
  /// planned_ranks' estimates (every rank up to ProcessMesh::kRankLines).
  std::vector<RankEstimate> ranks;
  int threads_per_rank = 1;
  double step_seconds = 0;  ///< the slowest rank's compute + idle + comm + update
  double peak_bytes() const;  ///< the largest rank's peak
  double tokens_per_step = 0;
};

/// The ranks a plan builds: every rank up to ProcessMesh::kRankLines;
/// beyond, the first member of each data and sequence group.
std::vector<int> planned_ranks(const dist::ProcessMesh& mesh);
/// Whether a view of `mesh` gathers samples: it refactors a base split
/// dimension with replicate ones into more split ranks than the base split
/// (a module above the stream's tensor-parallel degree; its members gather
/// their neighbours' samples and split its weights over all of them).
bool gathers_samples(const dist::MeshView& view, const dist::ProcessMesh& mesh);
/// Model state per rank from the planning build alone (no calibration):
/// params, grads and optimizer filled, the rest 0.
std::vector<RankEstimate> model_state(const Setup& setup);
/// The whole estimate of a resolved layout.
LayoutEstimate estimate(const Setup& setup, const Calibration& cal);
/// The step's schedule (every stage's actions in order), from the executor
/// rank 0 installs in a planning context, for --dry-run.
std::string describe_schedule(const Setup& setup);
/// One table, a line per rank (MiB), for --dry-run and hp-plan.
std::string describe_memory(const LayoutEstimate& e, bool with_activations);

/// Peak resident memory of this process so far and now (bytes).
double current_resident_bytes();

}  // namespace hp::plan
