#include "plugins/zero/param_residency.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <set>

#include "hp/comm/context.h"
#include "hp/comm/group.h"
#include "hp/memory/block_cache.h"
#include "hp/profile/trace.h"
#include "hp/model/aux_loss.h"

namespace hp::zero {

namespace {

class GatherAfterUpdate : public ParamResidency {
 public:
  explicit GatherAfterUpdate(std::shared_ptr<SlicePlan> s) : s_(std::move(s)), cuts(s_->cuts) {}

  /// The gather buckets, made at first use: the reducer's options (bucket
  /// size, overlap) are final by then.
  void plan() {
    if (planned_) return;
    planned_ = true;
    for (auto& b : s_->buckets()) {
      if (s_->dist->group(b.group).size() > 1) gather_plan.push_back(b);
    }
    auto first = [&](const Bucket& b) { return *std::min_element(b.cuts.begin(), b.cuts.end()); };
    std::stable_sort(gather_plan.begin(), gather_plan.end(),
                     [&](const Bucket& a, const Bucket& b) { return first(a) < first(b); });
    for (const auto& b : gather_plan) {
      // Each rank's updated slices back into the whole parameters.
      std::vector<dist::RedistributeItem> items;
      for (std::size_t i : b.cuts)
        items.push_back({cuts[i].param.spec.global_shape, cuts[i].slice_spec.placements, cuts[i].param.spec.placements});
      gathers_.emplace_back(*s_->dist, std::move(items));
    }
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
    issued = gather_plan.size();
  }

  at::Tensor update_target(Cut& c) override { return c.slice_of(c.param.tensor, c.me); }

  /// Issues the gather of gather_plan[pos].
  std::unique_ptr<dist::Redistributor::Pending> start_gather(std::size_t pos) {
    std::vector<at::Tensor> mine;
    for (std::size_t i : gather_plan[pos].cuts) mine.push_back(cuts[i].slice_of(cuts[i].param.tensor, cuts[i].me));
    return gathers_[pos].start(mine);
  }

  /// Waits gather_plan[pos]: the other members' slices land in the parameters.
  void finish_gather(std::size_t pos, std::unique_ptr<dist::Redistributor::Pending> work) {
    c10::NoGradGuard no_grad;
    std::vector<at::Tensor> params;
    for (std::size_t i : gather_plan[pos].cuts) params.push_back(cuts[i].param.tensor);
    gathers_[pos].finish(std::move(work), params);
  }

  /// Every replica's updated slices back into every parameter: at once
  /// (overlap off), or issued now and waited per block (wait_through).
  void after_update() override {
    plan();
    wait_all();
    if (!s_->options.overlap) {
      for (std::size_t pos = 0; pos < gather_plan.size(); ++pos) {
        finish_gather(pos, start_gather(pos));
      }
      return;
    }
    arrived = 0;
    issued = 0;
    top_up();
  }

  /// Keeps kGathersAhead gathers travelling beyond those arrived: each holds this
  /// rank's slices packed, a receive buffer of its bucket's whole size and
  /// the transport's own, so issuing every bucket at once held one and a
  /// half times the parameters on top at the next forward's peak. The
  /// issue points are the blocks' forwards, the same on every member.
  /// Measured at dp=2, 12 x 768, stage 1 (37 buckets of ~9 MB): 2 ahead,
  /// peak 1455 MiB, forward waiting ~105 ms a step, step 3.87-3.98 s; 8
  /// ahead, 1533-1566 MiB, ~55 ms, 3.64-3.67 s (plain dp's peak 1723 MiB).
  void top_up() {
    const std::size_t until = std::min(gather_plan.size(), arrived + kGathersAhead);
    for (; issued < until; ++issued) in_flight[issued] = start_gather(issued);
  }

  /// Waits until gather_plan[0, n) are in the parameters.
  void wait_through(std::size_t n) {
    if (arrived >= n) return;
    const auto t0 = std::chrono::steady_clock::now();
    for (; arrived < n; ++arrived) {
      top_up();
      finish_gather(arrived, std::move(in_flight[arrived]));
    }
    top_up();
    waited_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  void wait_all() override {
    plan();
    wait_through(gather_plan.size());
  }

  /// Before block `index`'s forward: what it (and every block before it) reads.
  void before_block(int index) override {
    plan();
    auto it = needed_before.upper_bound(index);
    if (it == needed_before.begin()) return;
    const std::size_t before = arrived;
    wait_through(std::prev(it)->second);
    in_forward += arrived - before;
  }

  void report(std::map<std::string, double>& figures) override {
    plan();
    // Time this step's forward waited for the parameter gathers issued by
    // the last update (0 with overlap off: they were waited in the update).
    figures["zero_gather_wait_seconds"] = waited_seconds;
    figures["zero_gathers"] = static_cast<double>(gather_plan.size());
    figures["zero_gathers_in_forward"] = static_cast<double>(in_forward);
    figures["zero_param_bytes"] = s_->param_bytes_held();
    waited_seconds = 0;
    in_forward = 0;
  }

 private:
  std::shared_ptr<SlicePlan> s_;
  std::vector<Cut>& cuts;
  bool planned_ = false;
  /// Gather buckets (groups of more than one member) in forward order: by
  /// their first parameter in model order.
  std::vector<Bucket> gather_plan;
  /// For each block index of this rank, how many of gather_plan must have
  /// arrived before its forward (every bucket holding a parameter of that
  /// block or an earlier one: a tied weight lives in an earlier block).
  std::map<int, std::size_t> needed_before;
  std::vector<dist::Redistributor> gathers_;  ///< per gather_plan bucket: slices to whole parameters
  std::vector<std::unique_ptr<dist::Redistributor::Pending>> in_flight;
  std::size_t arrived = 0;  ///< gather_plan[0, arrived) are in the parameters
  std::size_t issued = 0;   ///< gather_plan[0, issued) have been started
  double waited_seconds = 0;  ///< spent waiting for gathers since the last report
  std::size_t in_forward = 0;  ///< gathers waited by a block's forward since the last report
};

// A parameter keeps its tensor (the module and autograd hold it) but its
// storage is released between uses: the bytes go back to the allocator
// and the storage reports 0 bytes. Before a block's forward (and again
// before its backward) the storage is allocated anew and the members'
// slices are all-gathered into it through a second tensor on the same
// storage, so the parameter's version counter does not move and what
// autograd saved stays valid. A unit is one block's parameters of one
// shard group; a parameter that later blocks read too (a tied weight) is
// released only at the end of the step.
class GatherPerBlock : public ParamResidency {
 public:
  explicit GatherPerBlock(std::shared_ptr<SlicePlan> s) : s_(std::move(s)), cuts(s_->cuts) { plan_units(); }

  at::Tensor update_target(Cut& c) override { return s_->per_block(c) ? c.shard : c.slice_of(c.param.tensor, c.me); }
  void after_update() override {}  // the next forward gathers block by block
  void wait_all() override {}

  void report(std::map<std::string, double>& figures) override {
    figures["zero_gather_wait_seconds"] = 0;
    figures["zero_gathers"] = 0;
    figures["zero_gathers_in_forward"] = 0;
    figures["zero_param_bytes"] = s_->param_bytes_held();
    figures["zero_block_gathers"] = static_cast<double>(gathers_);
    figures["zero_block_gathers_prefetched"] = static_cast<double>(prefetched_);
    // The most whole-parameter bytes held at once during the step (the
    // blocks gathered together), beside the bytes of every sharded one.
    figures["zero_gathered_peak_bytes"] = gathered_peak;
    double all = 0;
    for (const auto& u : units) all += unit_bytes(u);
    figures["zero_sharded_param_bytes"] = all;
    gathers_ = 0;
    prefetched_ = 0;
    gathered_peak = gathered_bytes;
  }

 private:
  std::shared_ptr<SlicePlan> s_;
  std::vector<Cut>& cuts;

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
  std::size_t gathers_ = 0;     ///< since the last report
  std::size_t prefetched_ = 0;  ///< of those, in flight before their block asked (prefetch)
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


  void plan_units() {
    std::map<std::pair<int, std::string>, std::size_t> index;
    for (std::size_t i = 0; i < cuts.size(); ++i) {
      if (!s_->per_block(cuts[i])) continue;
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
  void step_begin() override {
    if (sharded_now) return;
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
  ///
  /// Under mixed precision (options.param_dtype bf16) a forward's or
  /// backward's gather moves the slices as bf16, half the bytes, and the
  /// parameters get the bf16 values (what the layers cast them to anyway);
  /// the fp32 masters stay in the slices. `exact` (a save) gathers them as
  /// they are.
  void issue(std::size_t u, bool exact = false) {
    Unit& unit = units[u];
    if (unit.state != Residency::kReleased) return;
    allocate_storage(unit);
    gathered_bytes += unit_bytes(unit);
    gathered_peak = std::max(gathered_peak, gathered_bytes);
    const at::ScalarType narrow = s_->options.param_dtype;
    if (!exact && narrow != at::kFloat && unit.shards.defined() && unit.shards.scalar_type() == at::kFloat) {
      unit.work = s_->gather_slices(unit.group, unit.cuts, nullptr, unit.shards.to(narrow));
      unit.state = Residency::kInFlight;
      ++gathers_;
      return;
    }
    auto& g = s_->dist->group(unit.group);
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
    else unit.work = s_->gather_slices(unit.group, unit.cuts, [](const Cut& c) { return c.shard; }, unit.shards);
    unit.state = Residency::kInFlight;
    ++gathers_;
  }

  /// A block needs unit u whole: issued now unless a prefetch already did.
  void ensure(std::size_t u, bool exact = false) {
    Unit& unit = units[u];
    if (unit.state == Residency::kHere) return;
    if (unit.state == Residency::kInFlight) ++prefetched_;
    issue(u, exact);
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
      throw dist::CommError("zero stage 3: rank " + std::to_string(s_->dist->rank()) + " gathering the parameters of " +
                            describe_unit(unit) + ": " + e.what());
    }
    if (unit.work) {
      std::vector<at::Tensor> targets;
      for (std::size_t i : unit.cuts) targets.push_back(alias_of(cuts[i].param.tensor));
      s_->place_slices(unit.cuts, all, /*skip=*/-1, targets);
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
    for (int d = 1; d <= s_->options.prefetch; ++d) {
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

  void before_block(int block) override {
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
    return (from_end ? n - 1 - i : i) <= s_->options.prefetch;
  }

  void after_block(int block, const Activations& in, const Activations& out) override {
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
    if (s_->options.reshard_after_forward && !aux_loss_replaying() && !(backward_follows && at_turn(block, /*from_end=*/true))) {
      release_block(block);
    }
  }

  /// After the step's reduction: everything back to slices.
  void step_end() override {
    if (!sharded_now) return;
    for (std::size_t u = 0; u < units.size(); ++u) release(u, /*even_pinned=*/true);
    backward = false;
  }

  /// Every parameter whole again (a save reads them; the next step
  /// releases them after taking the slices back).
  void materialize() override {
    if (!sharded_now) return;
    for (std::size_t u = 0; u < units.size(); ++u) ensure(u, /*exact=*/true);
    sharded_now = false;
  }
};

}  // namespace

std::shared_ptr<ParamResidency> make_param_residency(std::shared_ptr<SlicePlan> plan) {
  if (plan->options.parts.shard_params) return std::make_shared<GatherPerBlock>(std::move(plan));
  return std::make_shared<GatherAfterUpdate>(std::move(plan));
}

}  // namespace hp::zero
