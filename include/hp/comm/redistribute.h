#pragma once
// Turning one layout of a tensor into another: the one place that chooses
// the collective. A change of placement along a mesh dimension is
//   P -> R      all-reduce              P -> S(k)   reduce-scatter along k
//   S(k) -> R   all-gather along k      S(k) -> S(j) all-to-all
//   R -> S(k)   local cut               R -> P      local (member 0 keeps it)
// Dimensions that change the same way run as ONE collective over the group
// joining them (ProcessMesh::flat_over: a gradient summed over cp and dp is
// one all-reduce over cp x dp); where no group joins them, one collective
// per dimension, in the order given. Sums run first, then all-to-alls, then
// gathers, then local cuts.
//
// A Redistributor moves several tensors at once (a bucket): each item has
// its own global shape and placements, but all items must change over the
// same dimensions in the same way, so each step is one collective carrying
// every item (packed member-major where members receive different parts).
// Which member holds which part follows part_of, so uneven and nested
// shards are exact. Head-tail placements are not redistributed.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hp/comm/gather.h"
#include "hp/comm/group.h"
#include "hp/comm/placement.h"

namespace hp::dist {

class DistributedContext;

enum class CommOp { kAllReduce, kReduceScatter, kAllToAll, kAllGather, kLocal };
const char* to_string(CommOp op);

/// One collective of a redistribution.
struct CommStep {
  CommOp op = CommOp::kLocal;
  std::vector<std::string> dims;  ///< the mesh dimensions it changes
  std::string group;              ///< the group that runs it ("" for kLocal)
};

struct RedistributeOptions {
  /// Sums (all-reduce, reduce-scatter) run in this type; the result keeps
  /// the tensor's own. Undefined: the tensor's own type.
  at::ScalarType reduce_dtype = at::ScalarType::Undefined;
};

/// One tensor of a bucket: this rank's part of a tensor of `global_shape`,
/// laid out by `from`, to be laid out by `to`. Dimensions one list does not
/// name are replicated; shards keep the order of `to` (then of `from`).
struct RedistributeItem {
  std::vector<std::int64_t> global_shape;
  Placements from, to;
};

/// The steps that turn `from` into `to` on `mesh` (dimensions of size 1
/// take no part). Throws std::invalid_argument for a change no step makes
/// (a head-tail placement changed, a shard turned partial).
std::vector<CommStep> plan_redistribute(const ProcessMesh& mesh, const Placements& from, const Placements& to);
/// "all_reduce over cp_dp, reduce_scatter over dp"; "nothing".
std::string describe(const std::vector<CommStep>& steps);

class Redistributor {
 public:
  /// Plans every item; throws std::invalid_argument when items would need
  /// different steps or a step no collective makes.
  Redistributor(DistributedContext& ctx, std::vector<RedistributeItem> items, RedistributeOptions options = {});
  ~Redistributor();
  Redistributor(Redistributor&&) noexcept;
  Redistributor& operator=(Redistributor&&) noexcept;

  const std::vector<CommStep>& steps() const { return steps_; }
  std::size_t size() const { return items_.size(); }
  /// This rank's part of item i under `to`: its shape.
  std::vector<std::int64_t> result_shape(std::size_t i) const;

  /// A redistribution in flight: its first collective issued.
  class Pending {
   private:
    friend class Redistributor;
    std::size_t step = 0;
    std::vector<at::Tensor> locals;
    at::Tensor buffer;    ///< what the collective works on
    at::Tensor in_place;  ///< the caller's flat, summed in place (possibly through `buffer`)
    std::unique_ptr<Work> work;
    std::optional<UnevenGather> gather;
  };
  /// Issues the first step on `locals` (this rank's parts under `from`, one
  /// per item). When the first step is an all-reduce and `flat` is given,
  /// it must be the locals laid end to end (the items' tensors view it), and
  /// the sum runs in place on it, with no copy in or out.
  std::unique_ptr<Pending> start(const std::vector<at::Tensor>& locals, const at::Tensor& flat = {}) const;
  /// Waits the first step, runs the others, and returns each item's part
  /// under `to`. `into[i]`, when given, receives item i (a tensor of
  /// result_shape(i), e.g. the parameter a gather fills); otherwise results
  /// may be views of one buffer, or the locals themselves after an
  /// in-place sum.
  std::vector<at::Tensor> finish(std::unique_ptr<Pending> pending, const std::vector<at::Tensor>& into = {}) const;
  /// start then finish.
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& locals, const std::vector<at::Tensor>& into = {}) const;

 private:
  std::unique_ptr<Pending> issue(std::size_t step, const std::vector<at::Tensor>& locals, const at::Tensor& flat) const;
  struct Plan;
  std::unique_ptr<Plan> plan_;
  std::vector<CommStep> steps_;
  std::vector<RedistributeItem> items_;
};

/// One tensor: `local` (this rank's part under `from`) laid out by `to`.
at::Tensor redistribute(DistributedContext& ctx, const at::Tensor& local, const std::vector<std::int64_t>& global_shape,
                        const Placements& from, const Placements& to, RedistributeOptions options = {});

}  // namespace hp::dist
