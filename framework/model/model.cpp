#include "hp/model/model.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace hp {

namespace {
/// A block whose forward goes through a wrapper (e.g. recompute).
class WrappedBlock : public Block {
 public:
  WrappedBlock(std::shared_ptr<Block> inner, Wrapper w) : inner_(std::move(inner)), w_(std::move(w)) {
    register_module("inner", inner_);
  }
  Activations forward(const Activations& in) override {
    return w_([this](const Activations& a) { return inner_->forward(a); }, in);
  }
  BlockCost cost() const override { return inner_->cost(); }

 private:
  std::shared_ptr<Block> inner_;
  Wrapper w_;
};

/// A block whose every forward is announced to the observers first.
class ObservedBlock : public Block {
 public:
  ObservedBlock(std::shared_ptr<Block> inner, int index, std::vector<BlockObserver> observers)
      : inner_(std::move(inner)), index_(index), observers_(std::move(observers)) {
    register_module("inner", inner_);
  }
  Activations forward(const Activations& in) override {
    for (const auto& o : observers_) {
      if (o.before) o.before(index_);
    }
    Activations out = inner_->forward(in);
    for (const auto& o : observers_) {
      if (o.after) o.after(index_, in, out);
    }
    return out;
  }
  BlockCost cost() const override { return inner_->cost(); }

 private:
  std::shared_ptr<Block> inner_;
  int index_;
  std::vector<BlockObserver> observers_;
};
}  // namespace

Activations BuiltModel::forward(const Activations& in) const {
  Activations a = in;
  for (const auto& b : blocks) a = b->forward(a);
  return a;
}

std::int64_t BuiltModel::parameter_count() const {
  std::int64_t n = 0;
  for (const auto& p : params) n += p.tensor.numel();
  return n;
}

BuiltModel build_model(const ModelDescription& desc, BuildContext& ctx,
                       const std::vector<int>& which, bool with_loss) {
  BuiltModel m;
  for (int i = 0; i < static_cast<int>(desc.blocks.size()); ++i) {
    if (!which.empty() && std::find(which.begin(), which.end(), i) == which.end()) continue;
    ctx.set_current_block(i, desc.blocks[static_cast<std::size_t>(i)].name);
    auto block = desc.blocks[static_cast<std::size_t>(i)].build(ctx);
    if (!ctx.block_observers().empty()) block = std::make_shared<ObservedBlock>(block, i, ctx.block_observers());
    if (const Wrapper* w = ctx.wrapper("block")) block = std::make_shared<WrappedBlock>(block, *w);
    m.names.push_back(desc.blocks[static_cast<std::size_t>(i)].name);
    m.indices.push_back(i);
    m.blocks.push_back(block);
  }
  ctx.set_current_block(-1);
  if (with_loss && desc.loss) m.loss = desc.loss(ctx);
  m.params = ctx.params();
  m.buffers = ctx.buffers();
  m.step_end = ctx.step_end();
  return m;
}

}  // namespace hp
