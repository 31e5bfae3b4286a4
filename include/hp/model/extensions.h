#pragma once
// The model-side extension points features install into: the layer
// registry (TP, EP replace kinds), forward wrappers (recompute), the
// sequence layout (context parallel) and the precision policy.
#include <map>
#include <string>

#include "hp/model/build_context.h"
#include "hp/model/layers.h"
#include "hp/model/precision.h"

namespace hp {

class ModelExtensions {
 public:
  ModelExtensions() : layers_(LayerRegistry::dense()) {}

  LayerRegistry& layers() { return layers_; }
  const LayerRegistry& layers() const { return layers_; }

  /// One wrapper per scope ("block", "attention.core"); a second owner of the
  /// same scope is refused naming both.
  void add_wrapper(const std::string& scope, const std::string& owner, Wrapper w,
                   WrapperFilter applies = nullptr);
  /// Adds an observer of every block's forward (any number of owners; each
  /// point calls them in the order added).
  void add_block_observer(const std::string& owner, BlockObserver o);
  /// Lays the positions of every sequence over ranks (context parallel);
  /// one owner, a second is refused naming both.
  void set_sequence_layout(const std::string& owner, SequenceLayout layout);
  /// The layout set, or null.
  const std::shared_ptr<const SequenceLayout>& sequence_layout() const { return sequence_layout_; }
  /// The compute precision (mixed precision); one owner, a second is
  /// refused naming both. fp32 throughout when no feature sets it.
  void set_precision(const std::string& owner, PrecisionPolicy policy);
  const PrecisionPolicy& precision() const { return precision_; }
  /// Hands every wrapper, observer and the sequence layout to a build context.
  void apply_to(BuildContext& ctx) const;

 private:
  LayerRegistry layers_;
  struct Entry {
    std::string owner;
    Wrapper fn;
    WrapperFilter applies;
  };
  std::map<std::string, Entry> wrappers_;
  std::vector<std::pair<std::string, BlockObserver>> observers_;
  std::shared_ptr<const SequenceLayout> sequence_layout_;
  PrecisionPolicy precision_;
  std::string precision_owner_;
};

}  // namespace hp
