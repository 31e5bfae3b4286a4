#pragma once
// The parameters' residency under zero: where each parameter's values live
// between the optimizer step and the next forward.
//  - GatherAfterUpdate (parameters whole): after the update every replica's
//    slices are all-gathered back into the parameters (dist::Redistributor,
//    shard to replicate), issued in forward order and each waited just
//    before the first block that reads it (distributed.overlap), or at once.
//  - GatherPerBlock (parameters sharded): a parameter's storage is released
//    between uses; each block's parameters are gathered before its forward
//    and its backward, prefetched `prefetch` blocks ahead, and released after.
#include <map>
#include <memory>
#include <string>

#include "hp/model/activations.h"
#include "plugins/zero/slices.h"

namespace hp::zero {

class ParamResidency {
 public:
  virtual ~ParamResidency() = default;
  /// The tensor the optimizer updates for cut c: the parameter's slice, or
  /// the slice kept aside while the parameter is released.
  virtual at::Tensor update_target(Cut& c) = 0;
  /// After the optimizer updated every slice.
  virtual void after_update() = 0;
  /// Before / after block `index`'s forward (any recompute replay included).
  virtual void before_block(int index) = 0;
  virtual void after_block(int /*index*/, const Activations& /*in*/, const Activations& /*out*/) {}
  /// At a step's start, and after its reduction.
  virtual void step_begin() {}
  virtual void step_end() {}
  /// Everything in flight landed (a save, an evaluation or a load reads or
  /// writes parameters).
  virtual void wait_all() = 0;
  /// Every parameter whole (a save or a load).
  virtual void materialize() {}
  /// Figures of the step for metrics (and resets the counters).
  virtual void report(std::map<std::string, double>& figures) = 0;
};

/// The residency the composition asks for.
std::shared_ptr<ParamResidency> make_param_residency(std::shared_ptr<SlicePlan> plan);

}  // namespace hp::zero
