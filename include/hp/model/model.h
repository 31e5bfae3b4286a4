#pragma once
// A model description: named blocks in order, each with its cost and a way to
// build it, plus the loss. Blocks are built after the mesh exists, and only on
// the ranks that own them (as Megatron's model_provider), so parameters are
// created with their final shards.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hp/model/block.h"
#include "hp/model/build_context.h"

namespace hp {

class Config;

struct BlockDecl {
  std::string name;  ///< "embed", "blocks.0", ..., "head"; the prefix of its parameters
  BlockCost cost;
  std::function<std::shared_ptr<Block>(BuildContext&)> build;
};

struct ModelDescription {
  std::string name;
  std::vector<BlockDecl> blocks;
  std::function<std::shared_ptr<LossBlock>(BuildContext&)> loss;
  /// What the loss costs per token, counted with the last block when the
  /// pipeline balances stages.
  BlockCost loss_cost;
  /// Names of the auxiliary losses its blocks may add (add_aux_loss), in
  /// the order they are reported; every rank knows them all.
  std::vector<std::string> aux_losses;
};

/// Makes the description from the config (the model provider).
using ModelProvider = std::function<ModelDescription(const Config&)>;

/// The blocks this rank built, with every parameter's ShardSpec.
struct BuiltModel {
  std::vector<std::string> names;
  std::vector<int> indices;  ///< position of each built block in the description
  std::vector<std::shared_ptr<Block>> blocks;
  std::shared_ptr<LossBlock> loss;  ///< null unless this rank computes the loss
  std::vector<ParamEntry> params;
  /// Untrained state saved with the parameters (BuildContext::buffer).
  std::vector<ParamEntry> buffers;
  /// Called after each optimizer step (BuildContext::on_step_end).
  std::vector<BuildContext::StepEndFn> step_end;

  /// Runs the built blocks in order.
  Activations forward(const Activations& in) const;
  std::int64_t parameter_count() const;  ///< local elements
};

/// Builds the blocks whose indices are in `which` (all when empty) and the
/// loss when `with_loss`. Applies the "block" wrapper of the context.
BuiltModel build_model(const ModelDescription& desc, BuildContext& ctx,
                       const std::vector<int>& which = {}, bool with_loss = true);

}  // namespace hp
