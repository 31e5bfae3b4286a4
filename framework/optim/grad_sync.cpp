#include "hp/optim/grad_sync.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <stdexcept>

#include "hp/comm/context.h"
#include "hp/comm/group.h"
#include "hp/comm/redistribute.h"
#include "hp/optim/buckets.h"
#include "framework/optim/sum_squares.h"

namespace hp {

std::vector<std::vector<std::size_t>> cut_buckets(const std::vector<double>& bytes, double cap_bytes) {
  std::vector<std::vector<std::size_t>> out;
  std::vector<std::size_t> bucket;
  double held = 0, limit = std::min(cap_bytes, kFirstBucketBytes);
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    bucket.push_back(i);
    held += bytes[i];
    if (held >= limit) {
      out.push_back(std::move(bucket));
      bucket.clear();
      held = 0;
      limit = cap_bytes;
    }
  }
  if (!bucket.empty()) out.push_back(std::move(bucket));
  return out;
}

namespace {

std::vector<std::vector<std::size_t>> buckets_of(const std::vector<at::Tensor>& tensors, double bucket_bytes) {
  std::vector<double> bytes;
  bytes.reserve(tensors.size());
  for (const auto& t : tensors) bytes.push_back(static_cast<double>(t.nbytes()));
  return cut_buckets(bytes, bucket_bytes);
}

at::Tensor flatten(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> parts;
  parts.reserve(tensors.size());
  for (const auto& t : tensors) parts.push_back(t.reshape({-1}));
  return at::cat(parts);
}

void unflatten(const at::Tensor& flat, const std::vector<at::Tensor>& tensors) {
  std::int64_t off = 0;
  for (const auto& t : tensors) {
    const_cast<at::Tensor&>(t).copy_(flat.narrow(0, off, t.numel()).view_as(t));
    off += t.numel();
  }
}

std::vector<dist::Group*> groups_to_sum(dist::DistributedContext& dist, const std::vector<std::string>& names) {
  std::vector<dist::Group*> groups;
  for (const auto& name : names) {
    auto& g = dist.group(name);
    if (g.size() > 1) groups.push_back(&g);
  }
  return groups;
}

}  // namespace

void all_reduce_bucketed(dist::DistributedContext& dist, const std::vector<std::string>& group_names,
                         const std::vector<at::Tensor>& tensors, double bucket_bytes) {
  const auto groups = groups_to_sum(dist, group_names);
  if (groups.empty()) return;
  c10::NoGradGuard no_grad;
  for (const auto& idx : buckets_of(tensors, bucket_bytes)) {
    std::vector<at::Tensor> bucket;
    for (auto i : idx) bucket.push_back(tensors[i]);
    at::Tensor flat = flatten(bucket);
    for (auto* g : groups) g->all_reduce(flat);
    unflatten(flat, bucket);
  }
}

double global_grad_norm(dist::DistributedContext& dist, const std::vector<ParamEntry>& grads) {
  c10::NoGradGuard no_grad;
  // Sum of squares per split group: whole tensors are identical on every
  // rank of their stage and count once; split ones are summed over the
  // groups that split them. One read pass per tensor (sum_of_squares),
  // summed in double per list of split groups.
  std::map<std::vector<std::string>, double> acc;
  for (const auto& p : grads) {
    if (!p.tensor.defined()) continue;
    acc[p.spec.split_groups()] += sum_of_squares(p.tensor);
  }
  // Every rank of a stage holds the same names, so the same split groups in
  // the same (sorted) order: no collective is left waiting.
  double total = 0;
  for (const auto& [groups, sq] : acc) {
    at::Tensor s = at::full({1}, sq, at::kDouble);
    for (const auto& name : groups) {
      auto& g = dist.group(name);
      if (g.size() > 1) g.all_reduce(s);
    }
    total += s.item<double>();
  }
  auto& partition = dist.group(dist::MeshRole::kPartition);
  if (partition.size() > 1) {
    at::Tensor t = at::full({1}, total, at::kDouble);
    partition.all_reduce(t);
    total = t.item<double>();
  }
  return std::sqrt(total);
}

void clip_to(const std::vector<ParamEntry>& grads, double norm, double max_norm) {
  if (max_norm <= 0 || norm <= max_norm) return;
  c10::NoGradGuard no_grad;
  const double coef = max_norm / (norm + 1e-6);
  for (const auto& p : grads) {
    if (p.tensor.defined()) const_cast<at::Tensor&>(p.tensor).mul_(coef);
  }
}

namespace {

class BucketedReducer : public GradReducer {
 public:
  BucketedReducer(const ReducerOptions& o, std::vector<ParamEntry> params, dist::DistributedContext& dist)
      : options_(o), params_(std::move(params)), dist_(dist) {
    for (auto& p : params_) {
      // Every parameter gets a gradient buffer up front so buckets have a
      // fixed layout even when a parameter was not used this step.
      if (!p.tensor.grad().defined()) p.tensor.mutable_grad() = at::zeros_like(p.tensor);
    }
    // Reverse order: the last layers' gradients are ready first (as DDP
    // does), until the first step has shown the order they arrive in.
    std::vector<std::size_t> declared;
    for (std::size_t i = params_.size(); i-- > 0;) declared.push_back(i);
    apply(cut(declared));
  }

 private:
  /// Buckets of parameters cut from `order`: one set per list of partial
  /// dimensions (the gradients a redistribution of the same steps turns
  /// into their parameters' layout), each cut at options_.bucket_bytes in
  /// `order`; one queue per group of the first step, in the sets' order.
  struct Layout {
    std::vector<std::vector<std::size_t>> buckets, queues;
    std::vector<std::string> queue_group;
  };
  Layout cut(const std::vector<std::size_t>& order) const {
    Layout l;
    std::map<std::vector<std::string>, std::vector<std::size_t>> by_set;
    for (auto i : order) by_set[params_[i].spec.partial_dims()].push_back(i);
    for (const auto& [dims, idx] : by_set) {
      const auto& first = params_[idx.front()].spec;
      const auto steps = dist::plan_redistribute(dist_.mesh(), first.grad, first.placements);
      if (steps.empty()) continue;  // summed over dimensions of size 1 only
      std::size_t q = 0;
      while (q < l.queue_group.size() && l.queue_group[q] != steps[0].group) ++q;
      if (q == l.queue_group.size()) {
        l.queue_group.push_back(steps[0].group);
        l.queues.emplace_back();
      }
      std::vector<at::Tensor> grads;
      for (auto i : idx) grads.push_back(params_[i].tensor.grad());
      for (const auto& run : buckets_of(grads, options_.bucket_bytes)) {
        std::vector<std::size_t> members;
        for (auto k : run) members.push_back(idx[k]);
        l.queues[q].push_back(l.buckets.size());
        l.buckets.push_back(std::move(members));
      }
    }
    return l;
  }
  /// Makes `l` the reducer's buckets: their redistributions, their flat
  /// tensors (the gradients' values copied in) and a launcher, which keeps
  /// the counts `counts` learned (empty: it counts the next step). Taken by
  /// value: a rebuild passes the old launcher's counts, and the old launcher
  /// is destroyed below before the new one learns them.
  void apply(Layout l, std::vector<int> counts = {}) {
    c10::NoGradGuard no_grad;
    order_.clear();
    redist_.clear();
    for (const auto& members : l.buckets) {
      std::vector<dist::RedistributeItem> items;
      for (auto i : members) {
        const auto& spec = params_[i].spec;
        items.push_back({spec.global_shape, spec.grad, spec.placements});
      }
      order_.push_back(redist_.size());
      redist_.emplace_back(dist_, std::move(items), sum_options(options_));
    }
    members_ = l.buckets;
    pending_.clear();
    pending_.resize(members_.size());
    flats_.assign(members_.size(), at::Tensor());
    for (std::size_t b = 0; b < members_.size(); ++b) bind_to_flat(b);
    launcher_.reset();  // its hooks go quiet before the new ones are added
    launcher_ = std::make_unique<BucketLauncher>(params_, std::move(l.buckets), std::move(l.queues),
                                                 std::vector<bool>(l.queue_group.size(), true), options_.overlap,
                                                 dist_.rank(), [this](std::size_t b) { launch(b); });
    if (!counts.empty()) launcher_->learn_counts(counts);
  }

  /// After the first step (overlap on): the buckets cut again in the order
  /// the gradients first arrived in (parameters that got none keep the
  /// declared order, after the rest), as DDP rebuilds its buckets. Every
  /// replica must cut the same buckets: each group the reductions run over
  /// checks that its members agree, and every rank then rebuilds, or none.
  void rebuild() {
    const auto& arrived = launcher_->first_arrivals();
    if (arrived.empty()) return;  // no hooks: nothing was observed
    std::vector<bool> seen(params_.size(), false);
    std::vector<std::size_t> order;
    for (auto i : arrived) {
      if (!seen[i]) order.push_back(i);
      seen[i] = true;
    }
    for (std::size_t i = params_.size(); i-- > 0;) {
      if (!seen[i]) order.push_back(i);
    }
    Layout next = cut(order);
    const bool changed = next.buckets != members_;
    std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the buckets' members
    for (const auto& b : next.buckets) {
      for (auto i : b) h = (h ^ (i + 1)) * 1099511628211ull;
      h = (h ^ 0xffffull) * 1099511628211ull;
    }
    const auto mine = static_cast<std::int64_t>(h >> 2);
    bool agree = true;
    for (const auto& g : next.queue_group) {
      at::Tensor t = at::tensor({mine, -mine}, at::kLong);
      dist_.group(g).all_reduce(t, dist::ReduceKind::kMax);
      agree = agree && t[0].item<std::int64_t>() == mine && t[1].item<std::int64_t>() == -mine;
    }
    at::Tensor all = at::tensor({std::int64_t{agree ? 0 : 1}, std::int64_t{changed ? 1 : 0}}, at::kLong);
    dist_.group("world").all_reduce(all, dist::ReduceKind::kMax);
    const bool someone_disagrees = all[0].item<std::int64_t>() != 0;
    const bool someone_changed = all[1].item<std::int64_t>() != 0;
    rebuilt_ = someone_changed && !someone_disagrees;
    if (rebuilt_ && changed) apply(std::move(next), launcher_->counts());
  }

 public:
  void backward_done() override { launcher_->flush(); }

  void reduce() override {
    c10::NoGradGuard no_grad;
    launcher_->flush();
    // Waited in the sets' order; a redistribution's later steps (the
    // dimensions no one group joins) run as it is waited.
    for (auto b : order_) {
      // Gradients that are views of the bucket were summed in place.
      redist_[b].finish(std::move(pending_[b]), grads_of(b));
    }
    launcher_->end_step();
    if (options_.rebuild_buckets && options_.overlap && !checked_) {
      checked_ = true;
      rebuild();
    }
  }

  double clip(double max_norm) override {
    const auto grads = gradients();
    const double norm = global_grad_norm(dist_, grads);
    clip_to(grads, norm, max_norm);
    return norm;
  }

  std::vector<ParamEntry> gradients() const override {
    std::vector<ParamEntry> out;
    for (const auto& p : params_) out.push_back({p.spec, p.tensor.grad()});
    return out;
  }

  void accumulated(const at::Tensor& param) override {
    if (launcher_) launcher_->accumulated(param);
  }
  void report(std::map<std::string, double>& figures) const override {
    figures["grad_buckets"] = static_cast<double>(launcher_->size());
    // Launched during backward, from the hooks (0 in the first step and
    // without overlap).
    figures["grad_buckets_early"] = static_cast<double>(launcher_->early());
    // 1 once the buckets were cut again in the gradients' arrival order.
    if (options_.rebuild_buckets && options_.overlap) figures["grad_buckets_rebuilt"] = rebuilt_ ? 1 : 0;
  }

 private:
  std::vector<at::Tensor> grads_of(std::size_t b) const {
    std::vector<at::Tensor> out;
    for (auto i : members_[b]) out.push_back(params_[i].tensor.grad());
    return out;
  }

  /// Makes the gradients of bucket b views of one flat tensor, as DDP's
  /// gradient_as_bucket_view does: backward accumulates straight into the
  /// bucket, which is reduced in place, with no copy in or out. Kept only
  /// when every member's gradient is a contiguous float of one device.
  void bind_to_flat(std::size_t b) {
    const auto grads = grads_of(b);
    std::int64_t total = 0;
    for (const auto& g : grads) {
      if (g.scalar_type() != grads[0].scalar_type() || g.device() != grads[0].device() ||
          !g.is_floating_point())
        return;
      total += g.numel();
    }
    c10::NoGradGuard no_grad;
    at::Tensor flat = at::empty({total}, grads[0].options());
    std::int64_t off = 0;
    for (auto i : members_[b]) {
      at::Tensor& g = params_[i].tensor.mutable_grad();
      at::Tensor view = flat.narrow(0, off, g.numel()).view(g.sizes());
      view.copy_(g);
      g = view;
      off += view.numel();
    }
    flats_[b] = flat;
  }

  /// Whether bucket b's gradients are still the views bind_to_flat made
  /// (nothing replaced a gradient tensor since).
  bool bound(std::size_t b) const {
    if (!flats_[b].defined()) return false;
    const char* base = static_cast<const char*>(flats_[b].data_ptr());
    std::int64_t off = 0;
    for (auto i : members_[b]) {
      const at::Tensor& g = params_[i].tensor.grad();
      if (!g.defined() || !g.is_contiguous() || static_cast<const char*>(g.data_ptr()) != base + off * g.element_size())
        return false;
      off += g.numel();
    }
    return true;
  }

  void launch(std::size_t b) {
    c10::NoGradGuard no_grad;
    pending_[b] = redist_[b].start(grads_of(b), bound(b) ? flats_[b] : at::Tensor());
  }

  ReducerOptions options_;
  std::vector<ParamEntry> params_;
  dist::DistributedContext& dist_;
  bool checked_ = false;  ///< the first step's arrival order was looked at
  bool rebuilt_ = false;  ///< and the buckets were cut again from it
  std::vector<std::size_t> order_;                  ///< buckets in the order they are waited
  std::vector<std::vector<std::size_t>> members_;  ///< per bucket: parameter indices
  std::vector<dist::Redistributor> redist_;         ///< per bucket: partial sums to the parameters' layout
  std::vector<std::unique_ptr<dist::Redistributor::Pending>> pending_;  ///< per bucket: its first collective
  std::vector<at::Tensor> flats_;                   ///< per bucket: the flat tensor its gradients view (or undefined)
  std::unique_ptr<BucketLauncher> launcher_;
};

}  // namespace

namespace {

/// The post-hook on one parameter's AccumulateGrad node. Holds the launcher
/// through a token the launcher clears when it goes, since a hook cannot be
/// removed.
class AccumulatedHook : public torch::autograd::FunctionPostHook {
 public:
  AccumulatedHook(std::shared_ptr<BucketLauncher*> owner, std::size_t index)
      : owner_(std::move(owner)), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    if (*owner_) (*owner_)->accumulated(index_);
    return outputs;
  }

 private:
  std::shared_ptr<BucketLauncher*> owner_;
  std::size_t index_;
};

}  // namespace

struct BucketLauncher::Hooks {
  std::shared_ptr<BucketLauncher*> token;
  /// Kept alive here: a variable holds its accumulator weakly, and a new
  /// one (without the hook) would be made for each backward.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
};

BucketLauncher::BucketLauncher(const std::vector<ParamEntry>& params, std::vector<std::vector<std::size_t>> buckets,
                               std::vector<std::vector<std::size_t>> queues, std::vector<bool> hooked, bool overlap,
                               int rank, std::function<void(std::size_t)> launch)
    : buckets_(std::move(buckets)),
      queues_(std::move(queues)),
      hooked_(std::move(hooked)),
      rank_(rank),
      launch_(std::move(launch)) {
  for (const auto& p : params) {
    index_of_[p.tensor.unsafeGetTensorImpl()] = names_.size();
    names_.push_back(p.spec.name);
  }
  bucket_of_.assign(params.size(), -1);
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    for (auto i : buckets_[b]) bucket_of_[i] = static_cast<int>(b);
  }
  queue_of_.assign(buckets_.size(), -1);
  for (std::size_t q = 0; q < queues_.size(); ++q) {
    for (auto b : queues_[q]) queue_of_[b] = static_cast<int>(q);
  }
  fires_.assign(params.size(), 0);
  launches_.assign(buckets_.size(), 0);
  late_.assign(buckets_.size(), false);
  never_.assign(buckets_.size(), true);
  next_.assign(queues_.size(), 0);
  round_.assign(queues_.size(), 0);
  queue_rounds_.assign(queues_.size(), 1);
  hooks_ = std::make_unique<Hooks>();
  if (!overlap) return;
  hooks_->token = std::make_shared<BucketLauncher*>(this);
  for (std::size_t i = 0; i < params.size(); ++i) {
    const int b = bucket_of_[i];
    if (b < 0 || !hooked_[static_cast<std::size_t>(queue_of_[static_cast<std::size_t>(b)])]) continue;
    if (!params[i].tensor.requires_grad()) continue;
    auto acc = torch::autograd::impl::grad_accumulator(params[i].tensor);
    acc->add_post_hook(std::make_unique<AccumulatedHook>(hooks_->token, i));
    hooks_->accumulators.push_back(std::move(acc));
  }
}

BucketLauncher::~BucketLauncher() {
  if (hooks_->token) *hooks_->token = nullptr;
}

void BucketLauncher::accumulated(std::size_t i) {
  fires_[i] += 1;
  if (!learned_ && fires_[i] == 1) arrivals_.push_back(i);
  if (!learned_ && !provisional_) return;
  const auto b = static_cast<std::size_t>(bucket_of_[i]);
  const auto q = static_cast<std::size_t>(queue_of_[b]);
  if (fires_[i] > expected_[i]) {
    if (launches_[b] >= queue_rounds_[q] && provisional_) {
      // More than the first step's guess, after its bucket went: flush
      // sends it once more.
      late_[b] = true;
      return;
    }
    if (launches_[b] >= queue_rounds_[q]) {
      throw std::runtime_error("rank " + std::to_string(rank_) + ": gradient reduction overlap: " + names_[i] +
                               " received gradient " + std::to_string(fires_[i]) +
                               " of the step after its bucket was launched (the first step gave it " +
                               std::to_string(expected_[i]) +
                               "); the model's backward differs between steps: set distributed.overlap: false");
    }
    return;
  }
  if (next_[q] < queues_[q].size() && queues_[q][next_[q]] == b) launch_ready(q);
}

void BucketLauncher::accumulated(const at::Tensor& param) {
  const auto it = index_of_.find(param.unsafeGetTensorImpl());
  if (it == index_of_.end() || bucket_of_[it->second] < 0) return;
  accumulated(it->second);
}

bool BucketLauncher::ready(std::size_t b) const {
  if (never_[b]) return false;
  const auto q = static_cast<std::size_t>(queue_of_[b]);
  const int r = queue_rounds_[q];
  if (launches_[b] >= r) return false;
  for (auto i : buckets_[b]) {
    // Round k of parameter i is complete at (k + 1) / r of its gradients.
    if (fires_[i] * r < (launches_[b] + 1) * expected_[i]) return false;
  }
  return true;
}

void BucketLauncher::launch_bucket(std::size_t b) {
  ++launches_[b];
  launch_(b);
}

void BucketLauncher::launch_ready(std::size_t q) {
  auto& order = queues_[q];
  while (next_[q] < order.size() && ready(order[next_[q]])) {
    launch_bucket(order[next_[q]++]);
    if (!flushed_) ++early_;
    if (next_[q] == order.size() && round_[q] + 1 < queue_rounds_[q]) {
      next_[q] = 0;  // the queue's next round
      ++round_[q];
    }
  }
}

void BucketLauncher::guess_first_step(int per_step) {
  if (learned_ || !hooks_->token || per_step < 1) return;
  // Until the first step has counted, each parameter is expected to get
  // per_step gradients (one per micro-batch); the buckets then launch from
  // the hooks as in a learned step.
  provisional_ = true;
  expected_.assign(fires_.size(), per_step);
  for (std::size_t b = 0; b < buckets_.size(); ++b) never_[b] = !hooked_[static_cast<std::size_t>(queue_of_[b])];
  for (std::size_t q = 0; q < queues_.size(); ++q) queue_rounds_[q] = learn_rounds_ && hooked_[q] ? per_step : 1;
}

void BucketLauncher::flush() {
  if (flushed_) return;
  flushed_ = true;
  for (std::size_t q = 0; q < queues_.size(); ++q) {
    // The rounds the hooks did not reach (a backward unlike the first
    // step's) still send what they hold, so no gradient is left behind.
    while (next_[q] < queues_[q].size()) {
      launch_bucket(queues_[q][next_[q]++]);
      if (next_[q] == queues_[q].size() && round_[q] + 1 < queue_rounds_[q]) {
        next_[q] = 0;
        ++round_[q];
      }
    }
  }
  for (std::size_t q = 0; q < queues_.size(); ++q) {
    for (auto b : queues_[q]) {
      if (late_[b]) launch_bucket(b);
    }
  }
}

void BucketLauncher::end_step() {
  if (!learned_ && hooks_->token) {
    expected_ = fires_;
    learned_ = true;
    provisional_ = false;
  }
  std::fill(fires_.begin(), fires_.end(), 0);
  std::fill(late_.begin(), late_.end(), false);
  std::fill(launches_.begin(), launches_.end(), 0);
  std::fill(next_.begin(), next_.end(), 0);
  std::fill(round_.begin(), round_.end(), 0);
  flushed_ = false;
  last_early_ = early_;
  early_ = 0;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    // A bucket of a queue hooks may not launch, or holding a parameter that
    // got no gradient in the first step, is never ready from hooks: flush
    // launches it.
    never_[b] = !(learned_ && hooked_[static_cast<std::size_t>(queue_of_[b])]);
    for (auto i : buckets_[b]) {
      if (never_[b] || expected_[i] == 0) never_[b] = true;
    }
  }
  for (std::size_t q = 0; q < queues_.size(); ++q) {
    // Rounds: the greatest common divisor of the queue's gradient counts,
    // when every bucket of the queue is hooked and got gradients.
    int rounds = 0;
    for (auto b : queues_[q]) {
      if (!learn_rounds_ || !learned_ || never_[b]) {
        rounds = 1;
        break;
      }
      for (auto i : buckets_[b]) rounds = std::gcd(rounds, expected_[i]);
    }
    queue_rounds_[q] = std::max(1, rounds);
  }
}

void BucketLauncher::learn_counts(const std::vector<int>& counts) {
  if (learned_ || !hooks_->token || counts.size() != fires_.size()) return;
  fires_ = counts;
  end_step();
}

std::unique_ptr<GradReducer> make_bucketed_reducer(const ReducerOptions& options, const std::vector<ParamEntry>& params,
                                                   dist::DistributedContext& dist) {
  return std::make_unique<BucketedReducer>(options, params, dist);
}

}  // namespace hp
