#pragma once
// Tensor-parallel implementations of the layer kinds (Megatron-style):
//   linear.column     weight split by output features
//   linear.row        weight split by input features, output all-reduced, bias added once
//   embedding.vocab   vocabulary split (uneven splits allowed), out-of-range tokens masked
//   loss.cross_entropy  vocabulary-parallel: never gathers the full logits
//   moe               offered (unless expert_parallel replaces it): every expert's
//                     FFN split column/row over tp, one all-reduce of the output
// attention.heads and mlp need nothing of their own: they are built from the
// column and row kinds, so each rank owns whole heads and one slice of the FFN.
//
// Sequence parallel (Megatron-LM's, Korthikanti et al. 2022): activations
// between the parallel regions are [batch, seq / T, hidden] slices.
//   linear.column     all-gathers its input along the sequence (reduce-scatter in backward)
//   linear.row        reduce-scatters its output along the sequence (all-gather in backward)
//   embedding.vocab   reduce-scatters along the sequence
//   layer_norm        runs on the slice; weight and bias gradients summed over tp
//                     then the data dimensions (partial over tp: in the one bucketed sync after backward)
//   embedding.position adds the rows of this rank's slice; gradient summed over tp
//   dropout           applies the mask elements of this rank's positions (the
//                     mask is a function of the global position, no generator)
// Every element-wise op between regions (residual, dropout) then runs on 1/T
// of the tokens.
#include "framework/model/layers.h"

namespace hp::tensor_parallel {

struct Options {
  bool sequence_parallel = false;
};

/// Registers the kinds above into `registry`.
void replace_kinds(LayerRegistry& registry, const std::string& owner, const Options& options = {});

}  // namespace hp::tensor_parallel
