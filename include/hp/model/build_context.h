#pragma once
// What a layer sees while it is built: the config, this rank's place in the
// mesh, the layer registry, and the one way to create a parameter, which
// initialises the FULL tensor from (seed, global name) and keeps this rank's
// slice, so weights never depend on the layout.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hp/comm/placement.h"
#include "hp/model/activations.h"
#include "hp/model/precision.h"
#include "hp/model/sequence_layout.h"
#include "hp/model/shard_spec.h"

namespace torch::nn {
class Module;
}

namespace hp {

class Config;
class LayerRegistry;
struct StepContext;  // include/hp/plugin/feature_runtime.h
namespace dist {
class DistributedContext;
class Group;
}  // namespace dist

/// How a parameter is initialised (over the full tensor).
struct Init {
  enum class Kind { kNormal, kZeros, kOnes } kind = Kind::kNormal;
  double std = 0.02;
  static Init normal(double s) { return {Kind::kNormal, s}; }
  static Init zeros() { return {Kind::kZeros, 0.0}; }
  static Init ones() { return {Kind::kOnes, 0.0}; }
};

/// A parameter of this rank with its layout-independent description.
struct ParamEntry {
  ShardSpec spec;
  at::Tensor tensor;
  int block = -1;  ///< index (in model order) of the block that created it; -1 outside blocks
  /// Later blocks that read it too (a tied weight, through BuildContext::shared).
  std::vector<int> also_used_by;
  /// An embedding table (token or position), marked by its layer: the
  /// optimizer's default rule leaves it out of weight decay.
  bool embedding = false;
  /// Copies of its values its layer keeps beside it between steps (the
  /// packed expert products' panels: 2), marked by its layer: the
  /// planner counts them in a rank's memory.
  int kept_copies = 0;
};

/// Wraps a forward computation (used by recompute): gets the inner function
/// and its input, returns its output.
using ForwardFn = std::function<Activations(const Activations&)>;
using Wrapper = std::function<Activations(const ForwardFn& inner, const Activations& in)>;
using WrapperFilter = std::function<bool(int block_index, const std::string& block_name)>;
/// Sees every forward of a block (with its index in model order), inside
/// any block wrapper, so a recomputed block's replay is seen too: `before`
/// the forward, and `after` it with the block's input and output (either
/// may be empty).
struct BlockObserver {
  std::function<void(int block_index)> before;
  std::function<void(int block_index, const Activations& in, const Activations& out)> after;
};

/// [offset, length) of part `index` when `total` is split into `parts`
/// nearly equal pieces (include/hp/comm/slice.h).
using dist::split_range;

class BuildContext {
 public:
  BuildContext(const Config& config, dist::DistributedContext& dist, const LayerRegistry& layers,
               std::uint64_t seed);

  const Config& config() const { return config_; }
  /// Always present (a single-rank context where there is one process).
  dist::DistributedContext& dist() const { return *dist_; }
  const LayerRegistry& layers() const { return layers_; }
  std::uint64_t seed() const { return seed_; }

  /// Size of / this rank's index in a mesh group.
  int group_size(const std::string& group) const;
  int group_rank(const std::string& group) const;
  dist::Group* group(const std::string& group) const;
  /// Creates, initialises and registers parameter `local_name` of `module`:
  /// the full tensor (from the seed and the global name) cut to this rank's
  /// part by `placements` (outermost first; dist::cut), so the weights never
  /// depend on the layout. Placements over mesh dimensions of size 1 are
  /// dropped. The gradient is summed over `partial_grad` (the feature's own
  /// dimensions whose ranks see different positions of the data, e.g. tp
  /// under sequence parallel) and then over the mesh's data dimensions, each
  /// replaced by the replicate dimensions of a view the parameter is sharded
  /// along (experts sharded over ep sum over the rest of dp, edp).
  at::Tensor param(torch::nn::Module& module, const std::string& global_name,
                   const std::string& local_name, const std::vector<std::int64_t>& global_shape,
                   Init init, dist::Placements placements = {}, std::vector<std::string> partial_grad = {});
  /// Same, at explicit coordinates along the placements' dimensions (one
  /// per placement) instead of this rank's.
  at::Tensor param_at(torch::nn::Module& module, const std::string& global_name,
                      const std::string& local_name, const std::vector<std::int64_t>& global_shape,
                      Init init, dist::Placements placements, const std::vector<dist::MeshCoord>& coords,
                      std::vector<std::string> partial_grad = {});

  const std::vector<ParamEntry>& params() const { return params_; }
  /// Marks parameter `p` (created by param()) an embedding table.
  void mark_embedding(const at::Tensor& p);
  /// Marks parameter `p` as kept in `copies` more copies by its layer (fp32
  /// each, for as long as the layer lives).
  void mark_kept_copies(const at::Tensor& p, int copies);
  /// Describe-only: parameters and buffers are created on the meta device
  /// (shapes, no storage, no initial values), to list a model's parameters
  /// without building its tensors (hp-train --dry-run).
  void set_meta(bool meta) { meta_ = meta; }
  bool meta() const { return meta_; }

  /// Creates a model buffer: state that is not trained but is saved and
  /// loaded with the parameters (whole on every rank; zeros at start).
  at::Tensor buffer(torch::nn::Module& module, const std::string& global_name, const std::string& local_name,
                    const std::vector<std::int64_t>& shape);
  const std::vector<ParamEntry>& buffers() const { return buffers_; }

  /// Called after every optimizer step with the step's context (a layer's
  /// statistics, an aux-free bias update).
  using StepEndFn = std::function<void(StepContext&)>;
  void on_step_end(StepEndFn fn) { step_end_.push_back(std::move(fn)); }
  const std::vector<StepEndFn>& step_end() const { return step_end_; }

  /// Tensors shared between blocks (tied embeddings).
  void share(const std::string& key, const at::Tensor& t) { shared_[key] = t; }
  /// A tensor an earlier block shared; a parameter read this way records
  /// the block being built in its `also_used_by`.
  at::Tensor shared(const std::string& key);

  /// Forward wrappers by scope ("block", "attention.core"), set by features;
  /// `applies(index, name)` says whether that block (in model order) gets it.
  void set_wrapper(const std::string& scope, Wrapper w, WrapperFilter applies = nullptr);
  /// The wrapper of `scope` for the block being built now, or null.
  const Wrapper* wrapper(const std::string& scope) const;
  /// Observers of every block's forward, set by features.
  void add_block_observer(BlockObserver o) { observers_.push_back(std::move(o)); }
  const std::vector<BlockObserver>& block_observers() const { return observers_; }
  /// Index (in model order) of the block being built; -1 outside blocks.
  void set_current_block(int index, std::string name = "") {
    current_block_ = index;
    current_block_name_ = std::move(name);
  }
  int current_block() const { return current_block_; }
  /// How the positions of a sequence lie over ranks, set by a feature (null:
  /// every rank holds whole sequences). Layers that care about positions
  /// (position tables, dropout masks, attention) follow it.
  void set_sequence_layout(std::shared_ptr<const SequenceLayout> layout) { sequence_layout_ = std::move(layout); }
  const std::shared_ptr<const SequenceLayout>& sequence_layout() const { return sequence_layout_; }
  /// The compute precision, set by a feature (fp32 by default). Layers
  /// that start the activation stream (the token embedding) emit
  /// precision().param_dtype; the others follow their input's type.
  void set_precision(PrecisionPolicy p) { precision_ = p; }
  const PrecisionPolicy& precision() const { return precision_; }

 private:
  const Config& config_;
  dist::DistributedContext* dist_;
  const LayerRegistry& layers_;
  std::uint64_t seed_;
  std::vector<ParamEntry> params_;
  std::vector<ParamEntry> buffers_;
  std::vector<StepEndFn> step_end_;
  std::map<std::string, at::Tensor> shared_;
  struct ScopedWrapper {
    Wrapper fn;
    WrapperFilter applies;
  };
  std::map<std::string, ScopedWrapper> wrappers_;
  std::vector<BlockObserver> observers_;
  int current_block_ = -1;
  std::string current_block_name_;
  std::shared_ptr<const SequenceLayout> sequence_layout_;
  PrecisionPolicy precision_;
  bool meta_ = false;
};

/// The full tensor a parameter starts from: a function of (seed, global name).
at::Tensor initial_value(std::uint64_t seed, const std::string& global_name,
                         const std::vector<std::int64_t>& shape, Init init);

}  // namespace hp
