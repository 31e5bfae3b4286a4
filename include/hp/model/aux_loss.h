#pragma once
// Auxiliary losses (MoE load balancing, router z-loss): a block's forward
// adds them with add_aux_loss; the step adds them to the main loss, scales
// them like it (divided by the global token count, so a block reports a
// SUM over its micro-batch's tokens or sequences x their tokens) and
// reports each on its own. Outside a collection (evaluation, or a forward
// replayed by recompute during backward) add_aux_loss does nothing.
#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace hp {

void add_aux_loss(const std::string& name, const at::Tensor& sum);
/// True while a step's forward collects auxiliary losses on this thread
/// (false in evaluation and in a forward replayed by recompute).
bool aux_loss_collecting();
/// True inside a replayed forward (recompute); statistics must not count twice.
bool aux_loss_replaying();

/// Collects the auxiliary losses added on this thread while it lives.
class AuxLossScope {
 public:
  /// `replay`: a forward replayed by recompute in backward (its auxiliary
  /// losses are needed for their gradients; statistics were already counted).
  explicit AuxLossScope(bool replay = false);
  bool replay() const { return replay_; }
  ~AuxLossScope();
  AuxLossScope(const AuxLossScope&) = delete;
  AuxLossScope& operator=(const AuxLossScope&) = delete;

  /// Sum of everything added (an undefined tensor when nothing was).
  at::Tensor total() const;
  /// Each addition, in order.
  const std::vector<std::pair<std::string, at::Tensor>>& items() const { return items_; }
  void add(const std::string& name, const at::Tensor& sum) { items_.emplace_back(name, sum); }

 private:
  AuxLossScope* previous_;
  bool replay_;
  std::vector<std::pair<std::string, at::Tensor>> items_;
};

}  // namespace hp
