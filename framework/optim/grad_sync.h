#pragma once
// The gradient reducer collaborator: what happens to gradients between
// backward and the optimizer step. The built-in one all-reduces them in
// buckets over each parameter's grad_sync_group; a feature (zero) may
// reduce-scatter instead. Clipping and the global norm work from the
// ShardSpecs and the mesh roles, so a replicated parameter counts once, a
// split one is summed over its split groups, and every pipeline stage
// (partition) contributes.
#include <map>
#include <string>
#include <vector>

#include "framework/model/build_context.h"

namespace hp {

namespace dist {
class DistributedContext;
}

struct ReducerOptions {
  double bucket_bytes = 4.0 * 1024 * 1024;
  /// Launch each bucket's reduction during backward, as soon as its last
  /// gradient is accumulated (false: all of them after backward).
  bool overlap = true;
};

class GradReducer {
 public:
  virtual ~GradReducer() = default;
  /// Sums gradients over the replicating groups. The loss is already
  /// divided by the global token count, so the sum is the average.
  virtual void reduce() = 0;
  /// Called once the step's last backward has run, before any hook or
  /// collective of the step's end: a reducer that launched reductions during
  /// backward launches the rest now, so every rank issues them in the same
  /// order before anything else. reduce() waits for them.
  virtual void backward_done() {}
  /// Scales gradients so the global norm is at most `max_norm` (0: off);
  /// returns the norm before clipping.
  virtual double clip(double max_norm) = 0;
  /// The reduced gradients this rank holds, each with a ShardSpec naming
  /// the slice of the full gradient (for parity dumps).
  virtual std::vector<ParamEntry> gradients() const = 0;
  /// Figures of the step just reduced, for metrics.jsonl and /metrics
  /// (the bucketed reducer: grad_buckets, grad_buckets_early).
  virtual void report(std::map<std::string, double>& /*figures*/) const {}
};

/// Bucketed all-reduce over each parameter's grad_sync_group. Buckets are
/// cut once, in reverse parameter order, per group list, at most
/// options.bucket_bytes each. With options.overlap each bucket is launched
/// (over the list's first group) from a post-hook on its parameters'
/// gradient accumulators as soon as all of them have received the step's
/// last gradient, in bucket order; the remaining groups of the list and the
/// copy back run in reduce(). The numbers are bitwise those of the blocking
/// path: same buckets, same operations, same order per group.
std::unique_ptr<GradReducer> make_bucketed_reducer(const ReducerOptions& options, const std::vector<ParamEntry>& params,
                                                   dist::DistributedContext& dist);

/// Global L2 norm of `grads`: squares summed per split group (each group of
/// a composite split in turn), then over the partition role. Collective:
/// every rank of the job calls it with entries of the same split groups.
double global_grad_norm(dist::DistributedContext& dist, const std::vector<ParamEntry>& grads);

/// Multiplies every tensor of `grads` by max_norm / norm when norm > max_norm > 0.
void clip_to(const std::vector<ParamEntry>& grads, double norm, double max_norm);

/// Sums each tensor of `tensors` over `groups` (in order) in flat buckets
/// of at most `bucket_bytes`, in place.
void all_reduce_bucketed(dist::DistributedContext& dist, const std::vector<std::string>& groups,
                         const std::vector<at::Tensor>& tensors, double bucket_bytes);

}  // namespace hp
