#pragma once
// Gradient work between backward and the optimizer step: data-parallel
// all-reduce in buckets (per sync group: "dp", or "edp" for experts), and the
// global gradient norm computed from the ShardSpecs, so a replicated
// parameter counts once and a split one is summed over its shards.
#include <vector>

#include "framework/model/build_context.h"

namespace hp {

namespace dist {
class DistributedContext;
}

class GradSync {
 public:
  /// `dist` may be null (one process). `bucket_bytes`: flat buffer size.
  GradSync(dist::DistributedContext* dist, std::vector<ParamEntry> params, double bucket_bytes);

  /// Sums gradients over each parameter's grad_sync_group. The loss is
  /// already divided by the global token count, so the sum is the average.
  void all_reduce();
  /// The global L2 norm of all gradients of the model (every stage and shard).
  double global_norm() const;
  /// Scales gradients so the global norm is at most `max_norm` (0: off);
  /// returns the norm before clipping.
  double clip(double max_norm);

 private:
  dist::DistributedContext* dist_;
  std::vector<ParamEntry> params_;
  double bucket_bytes_;
};

}  // namespace hp
