#pragma once
// The sharded optimizer state under zero: each rank keeps the optimizer
// state of its slices only (named by the parameter's global name with the
// slice's ShardSpec, so a run resumes at another data-parallel size or with
// zero off), updates its slices with the same rule as the unsharded
// optimizer, and hands them to the parameters' residency.
#include <memory>

#include "hp/optim/optimizer.h"
#include "plugins/zero/param_residency.h"
#include "plugins/zero/slices.h"

namespace hp::zero {

std::unique_ptr<Optimizer> make_sharded_optimizer(const OptimizerOptions& options, std::shared_ptr<SlicePlan> plan,
                                                  std::shared_ptr<ParamResidency> residency);

}  // namespace hp::zero
