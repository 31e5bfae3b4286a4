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
//
// Per-module degrees (parallel folding, "DP attention"): the residual stream
// runs at tp = `size` (T); a module kind (attention, ffn, embedding, lm_head)
// may run at a degree D = T x M over its own view of the ranks: the T stream
// ranks (inner) times M data-parallel neighbours (outer), whose tokens it
// gathers. Its column layers enter by an all-gather of the batch over the
// outer group (and what tp does today over the inner one); its row layers
// leave by a reduce-scatter of the batch over the outer group (then today's
// all-reduce or reduce-scatter over the inner one). Backward mirrors each.
// The weights are split D ways; their gradients are summed over the view's
// data-parallel remainder.
#include <map>
#include <string>

#include "hp/model/layers.h"

namespace hp::tensor_parallel {

/// The mesh dimensions of one module kind's view (names registered by the plugin).
struct ModuleDims {
  std::string inner;  ///< the stream's tp ranks (T)
  std::string outer;  ///< the data-parallel neighbours whose tokens the module gathers (M)
  std::string flat;   ///< inner x outer: the module's tp group (D)
};

struct Options {
  bool sequence_parallel = false;
  /// Module kinds ("attention", "ffn", "embedding", "lm_head") at a degree
  /// above the stream's; a kind not listed runs on the stream's tp.
  std::map<std::string, ModuleDims> modules;
};

/// Registers the kinds above into `registry`.
void replace_kinds(LayerRegistry& registry, const std::string& owner, const Options& options = {});

}  // namespace hp::tensor_parallel
