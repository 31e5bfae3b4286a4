#pragma once
// Gradient slicing and reduction under zero: after backward each bucket's
// gradients go from partial sums to this rank's slices through one
// redistribution (a reduce-scatter over the shard group; an all-reduce over
// a feature's own partial dimension first), launched during backward as
// soon as a bucket is complete (distributed.overlap), at most two buckets
// in flight. Clipping uses the global norm of the slices. With
// release_full_grads a parameter's full gradient goes as soon as its bucket
// is sent, and (reduce_per_micro_batch) each micro-batch's gradients are
// sent as soon as its backward made them, the slices adding up.
#include <memory>

#include "hp/optim/grad_sync.h"
#include "plugins/zero/param_residency.h"
#include "plugins/zero/slices.h"

namespace hp::zero {

std::unique_ptr<GradReducer> make_grad_slicer(std::shared_ptr<SlicePlan> plan,
                                              std::shared_ptr<ParamResidency> residency);

}  // namespace hp::zero
