#include "hp/model/extensions.h"

#include <stdexcept>

namespace hp {

void ModelExtensions::add_wrapper(const std::string& scope, const std::string& owner, Wrapper w,
                                  WrapperFilter applies) {
  auto it = wrappers_.find(scope);
  if (it != wrappers_.end()) {
    throw std::invalid_argument("the '" + scope + "' forward wrapper is claimed by both '" +
                                it->second.owner + "' and '" + owner + "'");
  }
  wrappers_[scope] = Entry{owner, std::move(w), std::move(applies)};
}

void ModelExtensions::add_block_observer(const std::string& owner, BlockObserver o) {
  observers_.emplace_back(owner, std::move(o));
}

void ModelExtensions::set_sequence_layout(const std::string& owner, SequenceLayout layout) {
  if (sequence_layout_) {
    throw std::invalid_argument("the sequence layout is claimed by both '" + sequence_layout_->owner + "' and '" +
                                owner + "'");
  }
  layout.owner = owner;
  sequence_layout_ = std::make_shared<const SequenceLayout>(std::move(layout));
}

void ModelExtensions::set_precision(const std::string& owner, PrecisionPolicy policy) {
  if (!precision_owner_.empty()) {
    throw std::invalid_argument("the precision policy is claimed by both '" + precision_owner_ + "' and '" + owner +
                                "'");
  }
  precision_owner_ = owner;
  precision_ = policy;
}

void ModelExtensions::apply_to(BuildContext& ctx) const {
  ctx.set_sequence_layout(sequence_layout_);
  ctx.set_precision(precision_);
  for (const auto& [scope, e] : wrappers_) ctx.set_wrapper(scope, e.fn, e.applies);
  for (const auto& [owner, o] : observers_) ctx.add_block_observer(o);
}

}  // namespace hp
