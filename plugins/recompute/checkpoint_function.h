#pragma once
// Activation recompute as a custom autograd function: forward runs the inner
// computation without keeping its intermediate tensors; backward runs it
// again (under the dropout site and CPU RNG state of the first forward, so
// dropout draws the same mask) and
// back-propagates through the fresh graph.
#include <cstdint>

#include "hp/model/build_context.h"

namespace hp::recompute {

/// Runs `inner(in)` so that only `in` is kept for backward. At least one
/// input must require grad for gradients to flow (as with PyTorch's reentrant
/// checkpoint).
Activations checkpointed(const ForwardFn& inner, const Activations& in);

/// Regions replayed (recomputed in backward) on this process since the last
/// call; the feature reports it per step as `recompute_regions_replayed`.
std::int64_t take_replay_count();

}  // namespace hp::recompute
