#pragma once
// Tensor-parallel implementations of the layer kinds (Megatron-style):
//   linear.column     weight split by output features
//   linear.row        weight split by input features, output all-reduced, bias added once
//   embedding.vocab   vocabulary split (uneven splits allowed), out-of-range tokens masked
//   loss.cross_entropy  vocabulary-parallel: never gathers the full logits
// attention.heads and mlp need nothing of their own: they are built from the
// column and row kinds, so each rank owns whole heads and one slice of the FFN.
#include "framework/model/layers.h"

namespace hp::tensor_parallel {

/// Registers the four kinds above into `registry`.
void replace_kinds(LayerRegistry& registry, const std::string& owner);

}  // namespace hp::tensor_parallel
