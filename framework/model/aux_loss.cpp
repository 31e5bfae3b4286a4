#include "hp/model/aux_loss.h"

#include <ATen/ATen.h>

namespace hp {

namespace {
thread_local AuxLossScope* current = nullptr;
}

AuxLossScope::AuxLossScope(bool replay) : previous_(current), replay_(replay) { current = this; }
AuxLossScope::~AuxLossScope() { current = previous_; }

void add_aux_loss(const std::string& name, const at::Tensor& sum) {
  if (current) current->add(name, sum);
}

bool aux_loss_collecting() { return current != nullptr; }
bool aux_loss_replaying() { return current != nullptr && current->replay(); }

at::Tensor AuxLossScope::total() const {
  at::Tensor t;
  for (const auto& [name, v] : items_) t = t.defined() ? t + v : v;
  return t;
}

}  // namespace hp
