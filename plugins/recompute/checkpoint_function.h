#pragma once
// Activation recompute as a custom autograd function: forward runs the inner
// computation without keeping its intermediate tensors; backward runs it
// again (replaying the CPU RNG so dropout draws the same mask) and
// back-propagates through the fresh graph.
#include "framework/model/build_context.h"

namespace hp::recompute {

/// Runs `inner(in)` so that only `in` is kept for backward. At least one
/// input must require grad for gradients to flow (as with PyTorch's reentrant
/// checkpoint).
Activations checkpointed(const ForwardFn& inner, const Activations& in);

}  // namespace hp::recompute
