#pragma once
// zero's setup, in one place: every parameter cut over its shard group (the
// data dimensions among its gradient's partial dimensions: one group when
// the mesh joins them, cp x dp), along its tensor-parallel split dimension
// or dimension 0, each member's part given by the slice's placements
// (dist::part_of), and the buckets whose gradients one redistribution takes
// from partial sums to this rank's slices. The three mechanics work from it:
// the sharded optimizer state (sharded_optimizer.h), the gradient slicing and
// reduction (grad_slicer.h) and the parameters' gather, prefetch and release
// (param_residency.h). A stage is a Composition of them.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hp/comm/gather.h"
#include "hp/comm/redistribute.h"
#include "hp/model/build_context.h"

namespace hp::dist {
class DistributedContext;
}

namespace hp::zero {

/// What a stage is made of; the only place a stage number is read.
struct Composition {
  /// Gradients sharded: a full gradient goes as soon as its bucket is
  /// reduced, and the next backward makes it anew (stages 2 and 3).
  bool release_full_grads = false;
  /// Parameters sharded: released between uses, gathered per block
  /// (stage 3); otherwise whole, the updated slices gathered after the step.
  bool shard_params = false;
  static Composition of_stage(int stage) { return {stage >= 2, stage >= 3}; }
};

/// Everything the units read, known when the feature is installed.
struct ZeroOptions {
  Composition parts;
  int prefetch = 1;
  bool reshard_after_forward = true;
  /// reduce_per_micro_batch: reduce-scatter once per micro-batch (rounds).
  bool per_micro_batch = true;
  /// Stage 3's block cache: block_cache_mb in bytes (installed with it), 0: no cache.
  std::size_t block_cache_bytes = 0;
  double bucket_bytes = 25.0 * 1024 * 1024;
  bool overlap = true;
  /// Gradient sums cross in this type (ReducerOptions::reduce_dtype); stage
  /// 3 gathers the weights in param_dtype (the compute copies' type).
  at::ScalarType reduce_dtype = at::kFloat;
  at::ScalarType param_dtype = at::kFloat;
  /// Whether the gradients go once per micro-batch: asked for, released
  /// once sent (stages 2 and 3), and launched from backward (overlap).
  bool rounds() const { return per_micro_batch && parts.release_full_grads && overlap; }
};

/// Stages 1 and 2: the gathers of updated slices kept travelling at once
/// after a step (param_residency.cpp).
constexpr std::size_t kGathersAhead = 8;

/// Stage 3's block cache serves blocks of at least this many bytes.
constexpr std::size_t kBlockCacheMin = std::size_t{256} << 10;

/// One parameter's cut: which group it is sharded over, along which
/// dimension, each member's range along it, and this rank's slice.
struct Cut {
  ParamEntry param;
  /// Its gradient's partial dimensions: the cuts of one list, sharded over
  /// one group, share a redistribution.
  std::vector<std::string> partial;
  std::string shard_group;
  int dim = 0;
  /// Per member of shard_group: the offset and length along `dim`, in the
  /// parameter's local tensor, of the part slice_spec's placements give it.
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  int me = 0;
  ShardSpec slice_spec;
  at::Tensor slice_grad;
  /// slice_grad is storage of its own (each reduction copies into it).
  bool own_slice_grad = false;
  /// slice_grad holds a sum of this step already (reduce_per_micro_batch:
  /// the next round's sum is added to it).
  bool summed = false;
  /// Stage 3: this rank's slice of the parameter, kept while the
  /// parameter's own storage is released between uses.
  at::Tensor shard;

  at::Tensor slice_of(const at::Tensor& t, int member) const {
    return t.narrow(dim, ranges[static_cast<std::size_t>(member)].first, ranges[static_cast<std::size_t>(member)].second);
  }
  std::int64_t numel_of(int member) const {
    const auto& shape = param.tensor.sizes();
    std::int64_t n = ranges[static_cast<std::size_t>(member)].second;
    for (std::int64_t d = 0; d < static_cast<std::int64_t>(shape.size()); ++d) {
      if (d != dim) n *= shape[static_cast<std::size_t>(d)];
    }
    return n;
  }
};

/// One bucket of cuts: their gradients go from partial sums to this
/// rank's slices by one redistribution (a reduce-scatter over the shard
/// group, after an all-reduce over any dimension summed first).
struct Bucket {
  std::vector<std::size_t> cuts;
  std::string group;
  /// Only a reduce-scatter: launched from backward's hooks. Buckets summed
  /// over another group first launch after backward, so every rank issues
  /// those sums in one order beside the feature's own collectives.
  bool hooked = false;
  std::shared_ptr<dist::Redistributor> redist;
};


class SlicePlan {
 public:
  SlicePlan(const std::vector<ParamEntry>& params, dist::DistributedContext& d, ZeroOptions options);

  std::vector<Cut> cuts;
  dist::DistributedContext* dist = nullptr;
  ZeroOptions options;

  /// Buckets of cut indices in reverse model order (last layers first), per
  /// list of partial dimensions and shard group; cut by the reducer's rule
  /// (cut_buckets) at options.bucket_bytes.
  std::vector<Bucket> buckets() const;
  /// The same buckets' cut indices and groups only (no redistribution
  /// planned): what a bucket holds, for sizes.
  std::vector<std::pair<std::vector<std::size_t>, std::string>> bucket_cuts() const;
  /// The reduced gradients: each slice with its ShardSpec.
  std::vector<ParamEntry> gradients() const;
  /// Whether cut c's parameter is gathered per block: parameters sharded
  /// and a shard group of more than one.
  bool per_block(const Cut& c) const;
  /// Bytes of parameter storage this rank holds now (whole parameters and
  /// kept slices).
  double param_bytes_held() const;

  /// Starts one all-gather over `group` of the cuts `idx`: this rank's
  /// slices (`mine(cut)`) concatenated flat; every member's total is known
  /// from the cuts, so no lengths are exchanged. `flat`, when given,
  /// already is that concatenation.
  dist::UnevenGather gather_slices(const std::string& group, const std::vector<std::size_t>& idx,
                                   const std::function<at::Tensor(const Cut&)>& mine, at::Tensor flat = {});
  /// Copies every member's part of a finished gather (but member `skip`'s)
  /// into that member's slice of `targets[j]`, the tensor of cut idx[j].
  void place_slices(const std::vector<std::size_t>& idx, const std::vector<at::Tensor>& all, int skip,
                    const std::vector<at::Tensor>& targets);
};

}  // namespace hp::zero
