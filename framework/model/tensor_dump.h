#pragma once
// Tensor dumps for numerical investigations (`training.dump_routing_steps`,
// `training.dump_activations_steps`): what a step's training forward
// computed, recorded by the layers that compute it and written by the trainer
// once per rank and step, so that two runs (two layouts, two BLAS kernels, two
// machines' worth of rounding) can be compared tensor by tensor.
//
// Records are keyed by what makes them comparable across layouts: the
// layer's global name, what was recorded, and the global index of the first
// sample of the micro-batch (the dropout site), "blocks.0.moe:probs@s4". A
// forward replayed by recompute and evaluation record nothing. The recorder
// is process-wide (a pipeline schedule may run micro-batches on other
// threads) and guarded by a mutex; when no dump is asked for, a layer's only
// cost is one relaxed atomic load.
#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace hp::tensor_dump {

/// What a dump holds (a bit set).
enum What : unsigned {
  kNothing = 0,
  /// Every MoE layer's routing: logits, probabilities, selection scores,
  /// chosen experts, capacity decisions and the tokens' global positions.
  kRouting = 1,
  /// Every layer's forward output (layers built while kActivations is
  /// configured are wrapped to record it), and the routing.
  kActivations = 2,
};

/// Which dumps this process may take at some step; set before the model is
/// built (layer factories wrap layers only when kActivations is set).
void configure(unsigned what);
unsigned configured();

/// Opens the current step's collection of `what` (kNothing: none); the
/// trainer calls it before the step's forward passes.
void begin_step(unsigned what);
/// Closes it and hands over what was recorded, in recording order.
std::vector<std::pair<std::string, at::Tensor>> end_step();

/// Whether the current thread's forward should record `what` now: a
/// collection of it is open and this is a training forward that is not a
/// replay (include/hp/model/aux_loss.h).
bool recording(What what);

/// Records a detached, contiguous copy of `t` as "<name>:<what>@s<first sample>"
/// (the current dropout site's). A key recorded twice gets "#2", "#3", ...
void record(const std::string& name, const std::string& what, const at::Tensor& t);

}  // namespace hp::tensor_dump
