// The `zero` feature (ZeRO stages 1, 2 and 3): optimizer state (stage 1),
// gradients (stage 2) and parameters (stage 3) sharded over the
// replicating groups. Every parameter is cut along one dimension into one
// slice per replica (its tensor-parallel split dimension when it has one,
// else dimension 0, so a slice is still a range of the global tensor that a
// ShardSpec describes). After backward each rank reduce-scatters the
// gradients in buckets (Group::reduce_scatter with uneven chunks: an
// all-to-all of the slices, then a local sum in member order),
// clips with the global norm of the slices, updates only its slice with the
// same update rule as the unsharded optimizer, and all-gathers the updated
// slices: with distributed.overlap the gathers are issued after the update
// in forward order and each is waited just before the first block that
// needs it (a block observer), so they overlap the next step's start and
// forward; a save, an evaluation or a load waits for all of them. Its state is saved by global name with the slice's ShardSpec, so
// a zero run resumes at another data-parallel size and with zero off.
// Stage 2 also lets go of each parameter's full gradient as soon as its
// bucket's reduce-scatter has taken its copy (during backward with
// distributed.overlap), and the next step starts with no full gradients:
// a rank holds only its slices' gradients between steps and through the
// next forward. The numbers are stage 1's, bitwise (the same sums).
#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/GradMode.h>

#include <chrono>
#include <deque>
#include <functional>
#include <optional>
#include <set>

#include "backends/comm/context.h"
#include "backends/comm/gather.h"
#include "backends/comm/group.h"
#include "backends/comm/redistribute.h"
#include "backends/memory/block_cache.h"
#include "backends/profile/trace.h"
#include "framework/config/config.h"
#include "framework/metrics/metrics.h"
#include "framework/model/aux_loss.h"
#include "framework/model/extensions.h"
#include "framework/optim/buckets.h"
#include "framework/optim/grad_sync.h"
#include "framework/optim/optimizer.h"
#include "framework/plugin/feature_runtime.h"
#include "framework/plugin/plugin_export.h"

namespace hp::zero {

namespace {

const char* kStage = "features.zero.stage";
const char* kPerMicroBatch = "features.zero.reduce_per_micro_batch";


/// One parameter's cut: which group it is sharded over, along which
/// dimension, each member's range along it, and this rank's slice.
struct Cut {
  ParamEntry param;
  /// Its gradient's partial dimensions: the cuts of one list, sharded over
  /// one group, share a redistribution.
  std::vector<std::string> partial;
  std::string shard_group;
  int dim = 0;
  /// Per member of shard_group: the offset and length along `dim`, in the
  /// parameter's local tensor, of the part slice_spec's placements give it.
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  int me = 0;
  ShardSpec slice_spec;
  at::Tensor slice_grad;
  /// slice_grad holds a sum of this step already (reduce_per_micro_batch:
  /// the next round's sum is added to it).
  bool summed = false;
  /// Stage 3: this rank's slice of the parameter, kept while the
  /// parameter's own storage is released between uses.
  at::Tensor shard;

  at::Tensor slice_of(const at::Tensor& t, int member) const {
    return t.narrow(dim, ranges[static_cast<std::size_t>(member)].first, ranges[static_cast<std::size_t>(member)].second);
  }
  std::int64_t numel_of(int member) const {
    const auto& shape = param.tensor.sizes();
    std::int64_t n = ranges[static_cast<std::size_t>(member)].second;
    for (std::int64_t d = 0; d < static_cast<std::int64_t>(shape.size()); ++d) {
      if (d != dim) n *= shape[static_cast<std::size_t>(d)];
    }
    return n;
  }
};

/// Stage 3's block cache serves blocks of at least this many bytes.
constexpr std::size_t kBlockCacheMin = std::size_t{256} << 10;

/// What the optimizer and the reducer of one run share.
struct Shards {
  std::vector<Cut> cuts;
  double bucket_bytes = 25.0 * 1024 * 1024;
  dist::DistributedContext* dist = nullptr;

  Shards(const std::vector<ParamEntry>& params, dist::DistributedContext& d, int zero_stage)
      : dist(&d), stage(zero_stage) {
    const auto& mesh = d.mesh();
    for (const auto& p : params) {
      Cut c;
      c.param = p;
      c.partial = p.spec.partial_dims();
      // Sharded over the data dimensions among them (replicate and
      // sequence: the ranks holding the same values), as one group when
      // the mesh joins them (cp x dp); otherwise over the last, the others
      // summed first. A feature's own partial dimension (tp under sequence
      // parallel) is summed first too.
      std::vector<std::string> data;
      for (const auto& dim : c.partial) {
        const auto* md = mesh.find(dim);
        if (md && md->size > 1 && (md->role == dist::MeshRole::kReplicate || md->role == dist::MeshRole::kSequence))
          data.push_back(dim);
      }
      std::vector<std::string> over = data;
      c.shard_group = mesh.flat_over(data);
      if (c.shard_group.empty()) {
        c.shard_group = c.partial.empty() ? dist::ProcessMesh::data_dim() : c.partial.back();
        over = {c.shard_group};
      }
      c.dim = p.spec.sharded() ? p.spec.split_dim() : 0;
      auto& g = d.group(c.shard_group);
      c.me = g.rank();
      c.slice_spec = p.spec;
      c.slice_spec.grad.clear();
      // The parameter's placements, cut once more over the shard group's
      // dimensions, outermost first (so the members' parts follow their ranks).
      for (auto it = mesh.dims().rbegin(); it != mesh.dims().rend(); ++it) {
        if (std::find(over.begin(), over.end(), it->name) != over.end() && it->size > 1)
          c.slice_spec.placements.push_back({it->name, dist::Placement::shard(c.dim)});
      }
      for (const auto& v : mesh.views()) {
        for (auto it = v.dims.rbegin(); it != v.dims.rend(); ++it) {
          if (std::find(over.begin(), over.end(), it->name) != over.end() && it->size > 1)
            c.slice_spec.placements.push_back({it->name, dist::Placement::shard(c.dim)});
        }
      }
      const auto& pl = c.slice_spec.placements;
      const auto local = p.spec.offsets();
      for (int r : g.global_ranks()) {
        const auto box = dist::part_of(p.spec.global_shape, pl, dist::coords_of(mesh, pl, r)).boxes.at(0);
        const auto at = static_cast<std::size_t>(c.dim);
        c.ranges.emplace_back(box.offsets[at] - local[at], box.lengths[at]);
      }
      c.slice_spec.box = dist::part_of(p.spec.global_shape, pl, dist::coords_of(mesh, pl, d.rank())).boxes.at(0);
      // Stage 1 keeps every full gradient from the start; stages 2 and 3
      // make them in backward (none is held before the first step).
      if (stage < 2 && !p.tensor.grad().defined()) p.tensor.mutable_grad() = at::zeros_like(p.tensor);
      // A placeholder with the slice's shape (the optimizer's state is made
      // from it); the first reduction replaces it. Never written, so its
      // pages are never touched.
      c.slice_grad = at::empty(c.slice_of(p.tensor, c.me).sizes(), p.tensor.options());
      cuts.push_back(std::move(c));
    }
  }

  /// One bucket of cuts: their gradients go from partial sums to this
  /// rank's slices by one redistribution (a reduce-scatter over the shard
  /// group, after an all-reduce over any dimension summed first).
  struct Bucket {
    std::vector<std::size_t> cuts;
    std::string group;
    /// Only a reduce-scatter: launched from backward's hooks. Buckets summed
    /// over another group first launch after backward, so every rank issues
    /// those sums in one order beside the feature's own collectives.
    bool hooked = false;
    std::shared_ptr<dist::Redistributor> redist;
  };

  /// Buckets of cut indices in reverse model order (last layers first), per
  /// list of partial dimensions and shard group; cut by the reducer's rule
  /// (cut_buckets) at bucket_bytes.
  std::vector<Bucket> buckets() const {
    std::map<std::pair<std::vector<std::string>, std::string>, std::vector<std::size_t>> by_group;
    for (std::size_t i = cuts.size(); i-- > 0;) by_group[{cuts[i].partial, cuts[i].shard_group}].push_back(i);
    std::vector<Bucket> out;
    for (const auto& [key, idx] : by_group) {
      std::vector<double> bytes;
      for (std::size_t i : idx) bytes.push_back(static_cast<double>(cuts[i].param.tensor.nbytes()));
      for (const auto& run : cut_buckets(bytes, bucket_bytes)) {
        Bucket b;
        b.group = key.second;
        std::vector<dist::RedistributeItem> items;
        for (std::size_t k : run) {
          const Cut& c = cuts[idx[k]];
          b.cuts.push_back(idx[k]);
          items.push_back({c.param.spec.global_shape, c.param.spec.grad, c.slice_spec.placements});
        }
        b.redist = std::make_shared<dist::Redistributor>(*dist, std::move(items));
        const auto& steps = b.redist->steps();
        b.hooked = steps.size() == 1 && steps[0].op == dist::CommOp::kReduceScatter;
        out.push_back(std::move(b));
      }
    }
    return out;
  }

  /// Stage 2: drops the full gradients of a bucket's parameters (its
  /// reduce-scatter has copied them); the next backward starts them afresh.
  void release_grads(const Bucket& bucket) {
    for (std::size_t i : bucket.cuts) cuts[i].param.tensor.mutable_grad() = at::Tensor();
  }

  /// Starts the redistribution of one bucket's gradients (every member's
  /// slices packed member-major, summed in member order, so every replica
  /// adds in the same order).
  std::unique_ptr<dist::Redistributor::Pending> launch_scatter(const Bucket& bucket) {
    c10::NoGradGuard no_grad;
    std::vector<at::Tensor> grads;
    for (std::size_t i : bucket.cuts) {
      // Stage 2 starts a step without gradients: one no backward reached has none.
      auto& p = cuts[i].param.tensor;
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      grads.push_back(p.grad());
    }
    return bucket.redist->start(grads);
  }

  /// Waits a bucket's redistribution; the slices' gradients are views into
  /// the summed bucket (no copy), or the full gradients for a group of one.
  void finish_scatter(const Bucket& bucket, std::unique_ptr<dist::Redistributor::Pending> work) {
    c10::NoGradGuard no_grad;
    const auto parts = bucket.redist->finish(std::move(work));
    for (std::size_t k = 0; k < bucket.cuts.size(); ++k) {
      auto& c = cuts[bucket.cuts[k]];
      // A later round of the step (reduce_per_micro_batch) adds to the sum.
      if (c.summed) c.slice_grad.add_(parts[k]);
      else c.slice_grad = parts[k];
      c.summed = true;
    }
  }

  std::vector<ParamEntry> gradients() const {
    std::vector<ParamEntry> out;
    for (const auto& c : cuts) out.push_back({c.slice_spec, c.slice_grad});
    return out;
  }

  // ---- The all-gather of updated parameters ----------------------------------

  /// Gather buckets (groups of more than one member) in forward order: by
  /// their first parameter in model order.
  std::vector<Bucket> gather_plan;
  /// For each block index of this rank, how many of gather_plan must have
  /// arrived before its forward (every bucket holding a parameter of that
  /// block or an earlier one: a tied weight lives in an earlier block).
  std::map<int, std::size_t> needed_before;
  std::vector<std::optional<dist::UnevenGather>> in_flight;
  std::size_t arrived = 0;  ///< gather_plan[0, arrived) are in the parameters
  bool overlap = true;
  int stage = 1;
  bool planned = false;
  double waited_seconds = 0;  ///< spent waiting for gathers since the last report
  std::size_t in_forward = 0;  ///< gathers waited by a block's forward since the last report

  void plan_gathers() {
    if (planned) return;
    planned = true;
    plan_units();
    if (stage >= 3) {  // every sharded parameter is gathered per block instead
      in_flight.clear();
      arrived = 0;
      return;
    }
    for (auto& b : buckets()) {
      if (dist->group(b.group).size() > 1) gather_plan.push_back(b);
    }
    auto first = [&](const Bucket& b) { return *std::min_element(b.cuts.begin(), b.cuts.end()); };
    std::stable_sort(gather_plan.begin(), gather_plan.end(),
                     [&](const Bucket& a, const Bucket& b) { return first(a) < first(b); });
    std::map<int, std::size_t> last_of_block;  // block -> 1 + last position holding one of its parameters
    for (std::size_t pos = 0; pos < gather_plan.size(); ++pos) {
      for (std::size_t i : gather_plan[pos].cuts) {
        auto& n = last_of_block[cuts[i].param.block];
        n = std::max(n, pos + 1);
      }
    }
    std::size_t running = 0;
    for (const auto& [block, n] : last_of_block) {  // ascending block index; -1 first
      running = std::max(running, n);
      needed_before[block] = running;
    }
    in_flight.resize(gather_plan.size());
    arrived = gather_plan.size();
  }

  /// Starts one all-gather over `group` of the cuts `idx`: this rank's
  /// slices (`mine(cut)`) concatenated flat; every member's total is known
  /// from the cuts, so no lengths are exchanged. (Stage 1's update and
  /// stage 3's blocks both gather this way.)
  /// `flat`, when given, already is that concatenation (stage 3 keeps a
  /// unit's slices in one tensor).
  dist::UnevenGather gather_slices(const std::string& group, const std::vector<std::size_t>& idx,
                                   const std::function<at::Tensor(const Cut&)>& mine, at::Tensor flat = {}) {
    c10::NoGradGuard no_grad;
    auto& g = dist->group(group);
    std::vector<std::int64_t> totals(static_cast<std::size_t>(g.size()), 0);
    std::vector<at::Tensor> parts;
    for (std::size_t i : idx) {
      for (int m = 0; m < g.size(); ++m) totals[static_cast<std::size_t>(m)] += cuts[i].numel_of(m);
      if (!flat.defined()) parts.push_back(mine(cuts[i]).reshape({-1}));
    }
    if (!flat.defined()) flat = parts.size() == 1 ? parts[0] : at::cat(parts);
    return dist::all_gather_uneven_async(g, flat, 0, totals);
  }

  /// Copies every member's part of a finished gather (but member `skip`'s)
  /// into that member's slice of `targets[j]`, the tensor of cut idx[j].
  void place_slices(const std::vector<std::size_t>& idx, const std::vector<at::Tensor>& all, int skip,
                    const std::vector<at::Tensor>& targets) {
    c10::NoGradGuard no_grad;
    for (int m = 0; m < static_cast<int>(all.size()); ++m) {
      if (m == skip) continue;
      std::int64_t off = 0;
      for (std::size_t j = 0; j < idx.size(); ++j) {
        const Cut& c = cuts[idx[j]];
        at::Tensor dst = c.slice_of(targets[j], m);
        const std::int64_t k = c.numel_of(m);
        dst.copy_(all[static_cast<std::size_t>(m)].narrow(0, off, k).view(dst.sizes()));
        off += k;
      }
    }
  }

  /// Issues the gather of gather_plan[pos] (stage 1's update).
  dist::UnevenGather start_gather(std::size_t pos) {
    return gather_slices(gather_plan[pos].group, gather_plan[pos].cuts,
                         [](const Cut& c) { return c.slice_of(c.param.tensor, c.me); });
  }

  /// Waits gather_plan[pos] and copies the other members' slices in.
  void finish_gather(std::size_t pos, dist::UnevenGather& work) {
    const Bucket& b = gather_plan[pos];
    std::vector<at::Tensor> targets;
    for (std::size_t i : b.cuts) targets.push_back(cuts[i].param.tensor);
    place_slices(b.cuts, work.wait(), dist->group(b.group).rank(), targets);
  }

  /// Every replica's updated slices back into every parameter: at once
  /// (overlap off), or issued now and waited per block (wait_through).
  void all_gather_params() {
    plan_gathers();
    wait_all();
    if (!overlap) {
      for (std::size_t pos = 0; pos < gather_plan.size(); ++pos) {
        auto w = start_gather(pos);
        finish_gather(pos, w);
      }
      return;
    }
    for (std::size_t pos = 0; pos < gather_plan.size(); ++pos) in_flight[pos] = start_gather(pos);
    arrived = 0;
  }

  /// Waits until gather_plan[0, n) are in the parameters.
  void wait_through(std::size_t n) {
    if (arrived >= n) return;
    const auto t0 = std::chrono::steady_clock::now();
    for (; arrived < n; ++arrived) {
      finish_gather(arrived, *in_flight[arrived]);
      in_flight[arrived].reset();
    }
    waited_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  void wait_all() { wait_through(gather_plan.size()); }

  /// Before block `index`'s forward: what it (and every block before it) reads.
  void before_block(int index) {
    auto it = needed_before.upper_bound(index);
    if (it == needed_before.begin()) return;
    const std::size_t before = arrived;
    wait_through(std::prev(it)->second);
    in_forward += arrived - before;
  }

  // ---- Stage 3: parameters sharded, gathered per block ------------------------
  //
  // A parameter keeps its tensor (the module and autograd hold it) but its
  // storage is released between uses: the bytes go back to the allocator
  // and the storage reports 0 bytes. Before a block's forward (and again
  // before its backward) the storage is allocated anew and the members'
  // slices are all-gathered into it through a second tensor on the same
  // storage, so the parameter's version counter does not move and what
  // autograd saved stays valid. A unit is one block's parameters of one
  // shard group; a parameter that later blocks read too (a tied weight) is
  // released only at the end of the step.

  enum class Residency { kReleased, kInFlight, kHere };
  struct Unit {
    int block = -1;
    std::string group;
    std::vector<std::size_t> cuts;
    bool pinned = false;  ///< read by later blocks too: released only at the step's end
    Residency state = Residency::kHere;
    std::optional<dist::UnevenGather> work;
    /// The gather in flight when it writes straight into the parameters'
    /// storage (every member's slice of each parameter one contiguous range).
    std::unique_ptr<dist::Work> direct;
    at::Tensor shards;  ///< this rank's slices of the unit's parameters, one flat tensor (c.shard views it)
    at::DataPtr storage;  ///< the gathered parameters' one buffer while whole (each storage a range of it)
  };
  std::vector<Unit> units;
  std::vector<int> blocks;                         ///< this rank's blocks with units, in model order
  std::map<int, std::vector<std::size_t>> unit_of;  ///< block -> its units (and the units of weights it reads)
  bool sharded_now = false;  ///< parameters released (inside a step); false: every one whole
  bool backward = false;     ///< the step is in its backward (prefetch goes to earlier blocks)
  int prefetch = 1;
  bool reshard_after_forward = true;
  /// reduce_per_micro_batch: reduce-scatter once per micro-batch (rounds).
  bool per_micro_batch = false;
  /// Stage 3's block cache: block_cache_mb in bytes (installed with it), 0: no cache.
  std::size_t block_cache_bytes = 0;
  std::size_t stage3_gathers = 0;     ///< since the last report
  std::size_t stage3_prefetched = 0;  ///< of those, in flight before their block asked (prefetch)
  double gathered_bytes = 0, gathered_peak = 0;  ///< whole-parameter bytes held now / at most since the report

  double unit_bytes(const Unit& u) const {
    double n = 0;
    for (std::size_t i : u.cuts) n += static_cast<double>(cuts[i].param.tensor.numel() * cuts[i].param.tensor.element_size());
    return n;
  }
  /// "block 2 (blocks.1.attn.qkv.weight, ...)": what a unit's error names.
  std::string describe_unit(const Unit& u) const {
    return "block " + std::to_string(u.block) + " (" + cuts[u.cuts.front()].param.spec.name +
           (u.cuts.size() > 1 ? ", ..." : "") + ")";
  }

  static void release_storage(const at::Tensor& p) {
    auto* s = p.unsafeGetTensorImpl()->storage().unsafeGetStorageImpl();
    s->set_data_ptr_noswap(at::DataPtr(nullptr, p.device()));
    s->set_nbytes(0);
  }
  static std::size_t storage_bytes(const at::Tensor& p) {
    return static_cast<std::size_t>(p.numel()) * p.element_size();
  }
  static std::size_t aligned(std::size_t n) { return (n + 63) / 64 * 64; }
  /// Unit u's parameters whole again: one buffer (with the block cache, the
  /// same sizes come back block after block), each parameter's storage a
  /// non-owning range of it (the unit frees it on release).
  void allocate_storage(Unit& unit) {
    std::size_t total = 0;
    for (std::size_t i : unit.cuts) total += aligned(storage_bytes(cuts[i].param.tensor));
    unit.storage = c10::GetCPUAllocator()->allocate(total);
    char* buf = static_cast<char*>(unit.storage.get());
    std::size_t off = 0;
    for (std::size_t i : unit.cuts) {
      const at::Tensor& p = cuts[i].param.tensor;
      auto* s = p.unsafeGetTensorImpl()->storage().unsafeGetStorageImpl();
      s->set_data_ptr_noswap(at::DataPtr(buf + off, p.device()));
      s->set_nbytes(storage_bytes(p));
      off += aligned(storage_bytes(p));
    }
  }
  /// Unit u's parameters back to no storage, their buffer freed.
  void drop_storage(Unit& unit) {
    for (std::size_t i : unit.cuts) release_storage(cuts[i].param.tensor);
    unit.storage.clear();
  }
  /// A second tensor on the parameter's storage: writing through it leaves
  /// the parameter's version counter (which autograd checks) alone.
  static at::Tensor alias_of(const at::Tensor& p) {
    return at::empty({0}, p.options()).set_(p.storage(), p.storage_offset(), p.sizes(), p.strides());
  }

  bool stage3_cut(const Cut& c) const { return stage >= 3 && dist->group(c.shard_group).size() > 1; }

  void plan_units() {
    std::map<std::pair<int, std::string>, std::size_t> index;
    for (std::size_t i = 0; i < cuts.size(); ++i) {
      if (!stage3_cut(cuts[i])) continue;
      const auto key = std::make_pair(cuts[i].param.block, cuts[i].shard_group);
      auto it = index.find(key);
      if (it == index.end()) {
        it = index.emplace(key, units.size()).first;
        units.emplace_back();
        units.back().block = key.first;
        units.back().group = key.second;
      }
      units[it->second].cuts.push_back(i);
      if (!cuts[i].param.also_used_by.empty()) units[it->second].pinned = true;
    }
    std::set<int> seen;
    for (std::size_t u = 0; u < units.size(); ++u) {
      unit_of[units[u].block].push_back(u);
      seen.insert(units[u].block);
      for (std::size_t i : units[u].cuts) {
        for (int b : cuts[i].param.also_used_by) {
          auto& list = unit_of[b];
          if (std::find(list.begin(), list.end(), u) == list.end()) list.push_back(u);
        }
      }
    }
    blocks.assign(seen.begin(), seen.end());
  }

  /// At a step's start: the slices are taken from the whole parameters
  /// (after a load, or a save that gathered them), which are released.
  void shard_params() {
    if (stage < 3 || sharded_now) return;
    c10::NoGradGuard no_grad;
    for (auto& u : units) {
      if (!u.shards.defined()) {
        // The unit's slices side by side in one tensor: its gather sends it
        // as it is (no concatenation each time).
        std::int64_t total = 0;
        bool same_type = true;
        for (std::size_t i : u.cuts) {
          total += cuts[i].numel_of(cuts[i].me);
          same_type = same_type && cuts[i].param.tensor.dtype() == cuts[u.cuts.front()].param.tensor.dtype();
        }
        if (same_type) {
          u.shards = at::empty({total}, cuts[u.cuts.front()].param.tensor.options());
          std::int64_t off = 0;
          for (std::size_t i : u.cuts) {
            auto& c = cuts[i];
            const std::int64_t k = c.numel_of(c.me);
            c.shard = u.shards.narrow(0, off, k).view(c.slice_of(c.param.tensor, c.me).sizes());
            off += k;
          }
        }
      }
      for (std::size_t i : u.cuts) {
        auto& c = cuts[i];
        at::Tensor mine = c.slice_of(c.param.tensor, c.me);
        if (!c.shard.defined()) c.shard = mine.clone();
        else c.shard.copy_(mine);
      }
      drop_storage(u);
      u.state = Residency::kReleased;
    }
    gathered_bytes = 0;
    sharded_now = true;
    memory::release_block_cache();  // the whole parameters just freed are not asked for again
  }

  /// Issues unit u's gather. The parameters get their storage now: where
  /// every member's slice of each is one contiguous range of it (slices
  /// along the first dimension), the gather writes straight into it;
  /// otherwise the gathered slices are copied in when it lands.
  void issue(std::size_t u) {
    Unit& unit = units[u];
    if (unit.state != Residency::kReleased) return;
    allocate_storage(unit);
    gathered_bytes += unit_bytes(unit);
    gathered_peak = std::max(gathered_peak, gathered_bytes);
    auto& g = dist->group(unit.group);
    std::vector<std::vector<at::Tensor>> into(static_cast<std::size_t>(g.size()));
    bool direct = unit.shards.defined();
    for (int m = 0; m < g.size() && direct; ++m) {
      for (std::size_t i : unit.cuts) {
        at::Tensor piece = cuts[i].slice_of(alias_of(cuts[i].param.tensor), m);
        direct = direct && piece.is_contiguous();
        if (piece.numel() > 0) into[static_cast<std::size_t>(m)].push_back(piece);
      }
    }
    if (direct) unit.direct = g.all_gather_into_async(unit.shards, std::move(into));
    else unit.work = gather_slices(unit.group, unit.cuts, [](const Cut& c) { return c.shard; }, unit.shards);
    unit.state = Residency::kInFlight;
    ++stage3_gathers;
  }

  /// A block needs unit u whole: issued now unless a prefetch already did.
  void ensure(std::size_t u) {
    Unit& unit = units[u];
    if (unit.state == Residency::kHere) return;
    if (unit.state == Residency::kInFlight) ++stage3_prefetched;
    issue(u);
    land(u);
  }

  /// Waits unit u's gather and writes the members' slices into the parameters.
  void land(std::size_t u) {
    Unit& unit = units[u];
    c10::NoGradGuard no_grad;
    profile::Span span("comm", "zero_gather_wait");
    span.arg("block", unit.block);
    std::vector<at::Tensor> all;
    try {
      if (unit.direct) unit.direct->wait();
      else all = unit.work->wait();
    } catch (const dist::CommError& e) {
      unit.direct.reset();
      unit.work.reset();
      unit.state = Residency::kHere;  // storage allocated: a release frees it
      throw dist::CommError("zero stage 3: rank " + std::to_string(dist->rank()) + " gathering the parameters of " +
                            describe_unit(unit) + ": " + e.what());
    }
    if (unit.work) {
      std::vector<at::Tensor> targets;
      for (std::size_t i : unit.cuts) targets.push_back(alias_of(cuts[i].param.tensor));
      place_slices(unit.cuts, all, /*skip=*/-1, targets);
    }
    unit.direct.reset();
    unit.work.reset();
    unit.state = Residency::kHere;
  }

  void release(std::size_t u, bool even_pinned = false) {
    Unit& unit = units[u];
    if (unit.pinned && !even_pinned) return;
    if (unit.state == Residency::kInFlight) land(u);  // a collective is never abandoned
    if (unit.state != Residency::kHere) return;
    drop_storage(unit);
    unit.state = Residency::kReleased;
    gathered_bytes -= unit_bytes(unit);
  }

  /// Gathers a block's units and issues the next ones' (prefetch) in the
  /// direction the step runs.
  void gather_for(int block) {
    auto it = unit_of.find(block);
    if (it != unit_of.end()) {
      for (std::size_t u : it->second) ensure(u);
    }
    auto pos = std::find(blocks.begin(), blocks.end(), block);
    if (pos == blocks.end()) return;
    for (int d = 1; d <= prefetch; ++d) {
      const std::ptrdiff_t at = (pos - blocks.begin()) + (backward ? -d : d);
      if (at < 0 || at >= static_cast<std::ptrdiff_t>(blocks.size())) break;
      for (std::size_t u : unit_of[blocks[static_cast<std::size_t>(at)]]) issue(u);
    }
  }

  void release_block(int block) {
    auto it = unit_of.find(block);
    if (it == unit_of.end()) return;
    for (std::size_t u : it->second) {
      if (units[u].block == block) release(u);
    }
  }

  void before_block3(int block) {
    if (!sharded_now) return;  // whole (before the first step, after a save)
    if (!aux_loss_replaying()) backward = false;  // a forward (a replay runs inside backward)
    gather_for(block);
  }

  /// Whether `block` is among the first (from_end: last) 1 + prefetch of
  /// this rank's blocks: those a backward (from_end) or the next
  /// micro-batch's forward asks for before any compute could hide their
  /// gather, so they stay whole across the turn instead of being gathered
  /// again at once (FSDP keeps the last block for backward the same way).
  bool at_turn(int block, bool from_end) const {
    auto pos = std::find(blocks.begin(), blocks.end(), block);
    if (pos == blocks.end()) return false;
    const std::ptrdiff_t i = pos - blocks.begin();
    const std::ptrdiff_t n = static_cast<std::ptrdiff_t>(blocks.size());
    return (from_end ? n - 1 - i : i) <= prefetch;
  }

  void after_block3(int block, const Activations& in, const Activations& out) {
    if (!sharded_now) return;
    // Before the block's backward its parameters come back; once the
    // gradient of its input exists its backward is done with them.
    bool backward_follows = false;
    for (const auto& item : out.items()) {
      const at::Tensor& t = item.value();
      if (t.defined() && t.requires_grad()) {
        backward_follows = true;
        const_cast<at::Tensor&>(t).register_hook([this, block](const at::Tensor&) {
          backward = true;
          gather_for(block);
        });
      }
    }
    for (const auto& item : in.items()) {
      const at::Tensor& t = item.value();
      if (t.defined() && t.requires_grad()) {
        const_cast<at::Tensor&>(t).register_hook([this, block](const at::Tensor&) {
          if (!at_turn(block, /*from_end=*/false)) release_block(block);
        });
      }
    }
    // A forward replayed by recompute is followed by its backward at once.
    if (reshard_after_forward && !aux_loss_replaying() && !(backward_follows && at_turn(block, /*from_end=*/true))) {
      release_block(block);
    }
  }

  /// After the step's reduction: everything back to slices.
  void release_all() {
    if (!sharded_now) return;
    for (std::size_t u = 0; u < units.size(); ++u) release(u, /*even_pinned=*/true);
    backward = false;
  }

  /// Every parameter whole again (a save reads them; the next step
  /// releases them after taking the slices back).
  void materialize() {
    if (!sharded_now) return;
    for (std::size_t u = 0; u < units.size(); ++u) ensure(u);
    sharded_now = false;
  }

  /// Bytes of parameter storage this rank holds now.
  double param_bytes_held() const {
    double n = 0;
    for (const auto& c : cuts) n += static_cast<double>(c.param.tensor.storage().nbytes());
    for (const auto& c : cuts) {
      if (c.shard.defined()) n += static_cast<double>(c.shard.nbytes());
    }
    return n;
  }
};

/// Reduce-scatters gradient buckets; with distributed.overlap each bucket
/// without a pre-sum is launched during backward as soon as its gradients
/// are complete (BucketLauncher), those with one (tp first) after backward,
/// once their pre-sum is done.
class ZeroReducer : public GradReducer {
 public:
  ZeroReducer(std::shared_ptr<Shards> s, bool overlap) : s_(std::move(s)) {
    plan_ = s_->buckets();
    std::vector<std::vector<std::size_t>> members, queues;
    std::vector<bool> hooked;
    std::map<std::pair<bool, std::string>, std::size_t> queue_of;  // hooked queues sort first
    for (std::size_t b = 0; b < plan_.size(); ++b) {
      std::vector<std::size_t> params;
      for (auto i : plan_[b].cuts) params.push_back(i);
      members.push_back(params);
      const bool hook = plan_[b].hooked;
      queue_of.emplace(std::make_pair(!hook, plan_[b].group), 0);
    }
    for (auto& [key, q] : queue_of) {
      q = queues.size();
      queues.emplace_back();
      hooked.push_back(!key.first);
    }
    for (std::size_t b = 0; b < plan_.size(); ++b) {
      const bool hook = plan_[b].hooked;
      queues[queue_of.at({!hook, plan_[b].group})].push_back(b);
    }
    works_.resize(plan_.size());
    finished_.assign(plan_.size(), false);
    std::vector<ParamEntry> params;
    for (const auto& c : s_->cuts) params.push_back(c.param);
    launcher_ = std::make_unique<BucketLauncher>(params, std::move(members), std::move(queues), std::move(hooked),
                                                 overlap, s_->dist->rank(), [this](std::size_t b) { launch(b); });
    // reduce_per_micro_batch (stages 2 and 3: what a launch sent is
    // released, so each round carries its own micro-batch's gradients).
    // The rounds (micro-batches) are learned from the first step's counts.
    if (s_->stage >= 2 && s_->per_micro_batch) launcher_->learn_rounds();
  }
  // Stages 2 and 3 release what a launch sent, so the first step can launch
  // on a guess (one gradient per micro-batch) instead of holding every full
  // gradient until its end.
  void begin_step(int micro_batches) override {
    if (s_->stage >= 2) launcher_->guess_first_step(micro_batches);
    // A rank that sums the full gradients of several micro-batches before
    // reducing holds all of them at its peak: the block cache keeps their
    // bytes on top of block_cache_mb, so they are not unmapped after each
    // reduction and faulted in again the next step.
    if (s_->block_cache_bytes > 0 && micro_batches != micro_batches_) {
      micro_batches_ = micro_batches;
      std::size_t full = 0;
      if (micro_batches > 1 && !s_->per_micro_batch) {
        for (const auto& c : s_->cuts) full += static_cast<std::size_t>(c.param.tensor.numel()) * c.param.tensor.element_size();
      }
      memory::use_block_cache(kBlockCacheMin, s_->block_cache_bytes + full);
    }
  }
  void backward_done() override { launcher_->flush(); }
  void reduce() override {
    launcher_->flush();
    for (std::size_t b = 0; b < plan_.size(); ++b) finish(b);
    launched_.clear();
    finished_.assign(plan_.size(), false);
    for (auto& c : s_->cuts) c.summed = false;
    launcher_->end_step();
    s_->release_all();
    memory::trim_block_cache();
  }
  void report(std::map<std::string, double>& figures) const override {
    figures["grad_buckets"] = static_cast<double>(launcher_->size());
    figures["grad_buckets_early"] = static_cast<double>(launcher_->early());
    // Reduce-scatters of the step: one per bucket, or one per bucket and
    // micro-batch with reduce_per_micro_batch.
    figures["zero_reduce_scatters"] = static_cast<double>(launches_);
    launches_ = 0;
    // Time this step's forward waited for the parameter gathers issued by
    // the last update (0 with overlap off: they were waited in the update).
    figures["zero_gather_wait_seconds"] = s_->waited_seconds;
    figures["zero_gathers"] = static_cast<double>(s_->gather_plan.size());
    figures["zero_gathers_in_forward"] = static_cast<double>(s_->in_forward);
    // Gradient memory after the reduction: full gradients still held (stage
    // 1 keeps every one; stage 2 only those of groups of one) and slices.
    double full = 0, slices = 0;
    for (const auto& c : s_->cuts) {
      const auto& g = c.param.tensor.grad();
      if (g.defined()) full += static_cast<double>(g.nbytes());
      if (c.slice_grad.defined() && !(g.defined() && c.slice_grad.is_same(g))) {
        slices += static_cast<double>(c.slice_grad.numel() * c.slice_grad.element_size());
      }
    }
    figures["zero_full_grad_bytes"] = full;
    figures["zero_slice_grad_bytes"] = slices;
    // Parameter bytes held after the reduction (stage 3: the slices) and
    // the per-block gathers of the step.
    figures["zero_param_bytes"] = s_->param_bytes_held();
    if (s_->stage >= 3) {
      figures["zero_block_gathers"] = static_cast<double>(s_->stage3_gathers);
      figures["zero_block_gathers_prefetched"] = static_cast<double>(s_->stage3_prefetched);
      // The most whole-parameter bytes held at once during the step (the
      // blocks gathered together), beside the bytes of every sharded one.
      figures["zero_gathered_peak_bytes"] = s_->gathered_peak;
      double all = 0;
      for (const auto& u : s_->units) all += s_->unit_bytes(u);
      figures["zero_sharded_param_bytes"] = all;
    }
    s_->stage3_gathers = 0;
    s_->stage3_prefetched = 0;
    s_->gathered_peak = s_->gathered_bytes;
    s_->waited_seconds = 0;
    s_->in_forward = 0;
  }
  double clip(double max_norm) override {
    const auto grads = s_->gradients();
    const double norm = global_grad_norm(*s_->dist, grads);
    clip_to(grads, norm, max_norm);
    return norm;
  }
  std::vector<ParamEntry> gradients() const override { return s_->gradients(); }

 private:
  void launch(std::size_t b) {
    // A bucket launched again in the same step (another round) first
    // collects its previous launch.
    if (works_[b] && !finished_[b]) finish(b);
    finished_[b] = false;
    ++launches_;
    works_[b] = s_->launch_scatter(plan_[b]);
    // Stage 2: the redistribution holds its own copy of the bucket's
    // gradients (a group of one has none to send and keeps them).
    if (s_->stage >= 2 && !plan_[b].redist->steps().empty()) s_->release_grads(plan_[b]);
    // At most kInFlight buckets travel at once: each holds a flat copy of
    // its gradients, a receive buffer of the same size and its sum, so
    // launching every bucket before waiting any held three times the
    // gradients at the end of backward. Finishing the oldest is the same
    // sum, earlier.
    launched_.push_back(b);
    while (launched_.size() > kInFlight) {
      finish(launched_.front());
      launched_.pop_front();
    }
  }
  void finish(std::size_t b) {
    if (finished_[b]) return;
    s_->finish_scatter(plan_[b], std::move(works_[b]));
    works_[b].reset();
    finished_[b] = true;
  }
  static constexpr std::size_t kInFlight = 2;
  mutable std::size_t launches_ = 0;  ///< this step's, until reported
  int micro_batches_ = 0;             ///< of the last step (the block cache's cap follows it)
  std::deque<std::size_t> launched_;
  std::vector<bool> finished_;
  std::shared_ptr<Shards> s_;
  std::vector<Shards::Bucket> plan_;
  std::vector<std::unique_ptr<dist::Redistributor::Pending>> works_;
  std::unique_ptr<BucketLauncher> launcher_;
};

class ZeroOptimizer : public NamedStateOptimizer {
 public:
  ZeroOptimizer(OptimizerOptions o, std::shared_ptr<Shards> s) : NamedStateOptimizer(o), s_(std::move(s)) {
    for (const auto& c : s_->cuts) {
      ShardSpec spec = c.slice_spec;
      spec.name = c.param.spec.name;
      add_state(spec, c.slice_grad);
    }
  }
  void step(double lr) override {
    {
      c10::NoGradGuard no_grad;
      ++steps_;
      for (std::size_t i = 0; i < s_->cuts.size(); ++i) {
        auto& c = s_->cuts[i];
        // Stage 3 updates the slice kept aside; the parameter is gathered
        // from the slices before its block's next forward.
        at::Tensor target = s_->stage3_cut(c) ? c.shard : c.slice_of(c.param.tensor, c.me);
        apply_update(o_, steps_, lr, target, c.slice_grad, state_[i]);
      }
    }
    s_->all_gather_params();
  }
  void zero_grad() override {
    std::vector<ParamEntry> params;
    for (const auto& c : s_->cuts) {
      // Stage 2: a released gradient stays released (the backward makes it
      // anew); one kept (a group of one, a bucket summed first) is zeroed.
      if (s_->stage >= 2 && !c.param.tensor.grad().defined()) continue;
      params.push_back(c.param);
    }
    zero_gradients(params);
  }

 private:
  std::shared_ptr<Shards> s_;
};

class ZeroFeature : public Feature {
 public:
  void declare_options(Schema& s, const std::string& prefix) const override {
    s.add_int(prefix + "stage", 1).range(1, 3)
        .describe("ZeRO stage: 1 shards the optimizer state over the data-parallel replicas; 2 also the gradients "
                  "(a rank keeps only its slices' gradients once they are reduce-scattered); 3 also the parameters "
                  "(each block's are gathered before its forward and its backward, and released after). The "
                  "numbers are the same at every stage, bitwise.");
    s.add_int(prefix + "prefetch", 1).range(0, 64)
        .describe("Stage 3: how many blocks ahead (in forward; behind, in backward) a block's parameter gather is "
                  "issued while the current block computes.");
    s.add_bool(prefix + "block_cache", true)
        .describe("Stage 3: serve blocks of 256 KiB and more (a gathered block's storage, its gather buffers, the "
                  "activations) from mappings of their own, freed ones kept for reuse by exact size, instead of "
                  "glibc's heap, where blocks gathered and freed between the activations fragment it and the "
                  "process holds far more than it uses.")
        .note("12 x 768 GPT, dp=2: peak resident memory 2152 -> 1487 MiB (RFC 0006)");
    s.add_int(prefix + "block_cache_mb", 256)
        .range(0, 1 << 20)
        .describe("Stage 3 with block_cache: at most this many MiB of freed blocks kept for reuse (the oldest are "
                  "unmapped first; blocks a whole step did not ask for go back after it). 0 keeps none: the least "
                  "memory, every large block mapped and faulted in anew. When a rank sums the full gradients of "
                  "several micro-batches (reduce_per_micro_batch: false) the cache keeps their bytes on top: they "
                  "are in use at the peak anyway, and otherwise they are faulted in anew every step.")
        .note("12 x 768 GPT, dp=2: step 1.10-1.21x -> 1.00-1.05x plain dp's with the gradients kept on top, "
              "peak unchanged (RFC 0006)");
    s.add_bool(prefix + "reduce_per_micro_batch", false)
        .describe("Stages 2 and 3: reduce-scatter each micro-batch's gradients as soon as its backward has produced "
                  "them and add the slices up (as DeepSpeed and FSDP do), so no rank holds full gradients across "
                  "micro-batches; false sums the micro-batches locally first and reduces once, stage 1's numbers "
                  "bitwise. The sums then run in another order: within the parity bars, not bitwise. Needs "
                  "distributed.overlap (the rounds are launched from backward).");
    s.add_bool(prefix + "reshard_after_forward", true)
        .describe("Stage 3: release a block's gathered parameters after its forward (gathered again for its "
                  "backward); false keeps them until the step's end: less communication, more memory.");
  }

  void validate(const FeatureContext& ctx, ConfigErrors& e) const override {
    const Config& c = ctx.config;
    if (!c.ok({kStage, kPerMicroBatch})) return;
    if (c.get_bool(kPerMicroBatch) && c.get_int(kStage) < 2) {
      e.add(kPerMicroBatch, "true",
            "stage 1 keeps every full gradient, so reducing per micro-batch would only add communication",
            "features.zero.stage: 2 or 3, or reduce_per_micro_batch: false");
    }
  }

  void install(FeatureRuntime& rt) override {
    // The optimizer is made first, then the reducer, for the same parameters.
    auto shards = std::make_shared<std::shared_ptr<Shards>>();
    const int stage = static_cast<int>(rt.config().get_int(kStage));
    const int prefetch = static_cast<int>(rt.config().get_int("features.zero.prefetch"));
    const bool reshard = rt.config().get_bool("features.zero.reshard_after_forward");
    const bool per_micro_batch = rt.config().get_bool(kPerMicroBatch);
    const bool block_cache = stage >= 3 && rt.config().get_bool("features.zero.block_cache");
    const std::size_t cache_bytes =
        block_cache ? static_cast<std::size_t>(rt.config().get_int("features.zero.block_cache_mb")) << 20 : 0;
    if (block_cache) memory::use_block_cache(kBlockCacheMin, cache_bytes);
    metrics::Gauge* gauge = rt.has_metrics()
        ? &rt.metrics().gauge("hp_zero_optimizer_state_bytes", "Optimizer state bytes this rank holds under zero.")
        : nullptr;
    rt.set_optimizer("zero", [shards, gauge, stage](const OptimizerOptions& o, const std::vector<ParamEntry>& params,
                                                     dist::DistributedContext& d) -> std::unique_ptr<Optimizer> {
      if (!*shards) *shards = std::make_shared<Shards>(params, d, stage);
      (*shards)->stage = stage;
      auto opt = std::make_unique<ZeroOptimizer>(o, *shards);
      if (gauge) gauge->set(static_cast<double>(opt->state_bytes()));
      return opt;
    });
    rt.set_grad_reducer("zero", [shards, stage, prefetch, reshard, per_micro_batch, cache_bytes](
                                    const ReducerOptions& o, const std::vector<ParamEntry>& params,
                                                dist::DistributedContext& d) -> std::unique_ptr<GradReducer> {
      if (!*shards) *shards = std::make_shared<Shards>(params, d, stage);
      (*shards)->stage = stage;
      (*shards)->prefetch = prefetch;
      (*shards)->reshard_after_forward = reshard;
      (*shards)->per_micro_batch = per_micro_batch;
      (*shards)->block_cache_bytes = cache_bytes;
      (*shards)->bucket_bytes = o.bucket_bytes;
      (*shards)->overlap = o.overlap;
      (*shards)->plan_gathers();
      return std::make_unique<ZeroReducer>(*shards, o.overlap);
    });
    // The gathers of the last update land just before the blocks that read
    // them; anything else that reads parameters waits for all of them.
    BlockObserver watch;
    watch.before = [shards, stage](int block) {
      if (!*shards) return;
      if (stage >= 3) (*shards)->before_block3(block);
      else (*shards)->before_block(block);
    };
    if (stage >= 3) {
      watch.after = [shards](int block, const Activations& in, const Activations& out) {
        if (*shards) (*shards)->after_block3(block, in, out);
      };
      // A step starts from the slices; a save or a load reads or writes
      // whole parameters.
      rt.add_hook(StepEvent::kStepBegin, "zero", [shards](StepContext&) {
        if (*shards) (*shards)->shard_params();
      });
    }
    rt.model().add_block_observer("zero", watch);
    for (StepEvent e : {StepEvent::kSave, StepEvent::kEval, StepEvent::kLoad}) {
      rt.add_hook(e, "zero", [shards, e](StepContext&) {
        if (!*shards) return;
        (*shards)->wait_all();
        if (e != StepEvent::kEval) (*shards)->materialize();
      });
    }
  }
};

}  // namespace
}  // namespace hp::zero

HP_FEATURE_PLUGIN(hp::zero::ZeroFeature)
