#include "hp/comm/redistribute.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <stdexcept>

#include "hp/comm/context.h"
#include "hp/comm/gather.h"
#include "hp/comm/group.h"
#include "hp/comm/mesh.h"

namespace hp::dist {

const char* to_string(CommOp op) {
  switch (op) {
    case CommOp::kAllReduce: return "all_reduce";
    case CommOp::kReduceScatter: return "reduce_scatter";
    case CommOp::kAllToAll: return "all_to_all";
    case CommOp::kAllGather: return "all_gather";
    case CommOp::kLocal: return "local";
  }
  return "?";
}

std::string describe(const std::vector<CommStep>& steps) {
  if (steps.empty()) return "nothing";
  std::string out;
  for (const auto& s : steps) {
    if (!out.empty()) out += ", ";
    out += to_string(s.op);
    std::string dims;
    for (const auto& d : s.dims) dims += (dims.empty() ? "" : " x ") + d;
    out += " over " + (s.group.empty() || s.dims.size() == 1 ? dims : s.group + " (" + dims + ")");
  }
  return out;
}

namespace {

/// One mesh dimension's placement before and after.
struct Change {
  std::string dim;
  Placement from, to;
};

const Placement* find_in(const Placements& list, const std::string& dim) {
  for (const auto& p : list)
    if (p.dim == dim) return &p.placement;
  return nullptr;
}

/// Both lists over the same dimensions (larger than 1), in `to`'s order then
/// `from`'s; a dimension a list does not name is replicated there.
std::vector<Change> changes_of(const ProcessMesh& mesh, const Placements& from, const Placements& to) {
  std::vector<Change> out;
  auto add = [&](const std::string& dim) {
    if (!mesh.has(dim)) {
      throw std::invalid_argument("redistribute: placement over '" + dim + "', which mesh " + mesh.shape() +
                                  " does not have");
    }
    if (mesh.group_size(dim) == 1) return;
    for (const auto& c : out)
      if (c.dim == dim) return;
    const Placement* f = find_in(from, dim);
    const Placement* t = find_in(to, dim);
    out.push_back({dim, f ? *f : Placement::replicate(), t ? *t : Placement::replicate()});
  };
  for (const auto& p : to) add(p.dim);
  for (const auto& p : from) add(p.dim);
  return out;
}

/// The operation that makes one change; throws for one nothing makes.
std::optional<CommOp> op_of(const Change& c) {
  using K = Placement::Kind;
  if (c.from == c.to) return std::nullopt;
  const std::string what = "redistribute over '" + c.dim + "': " + c.from.str() + " -> " + c.to.str();
  if (c.from.kind == K::kHeadTail || c.to.kind == K::kHeadTail)
    throw std::invalid_argument(what + ": head-tail placements are not redistributed");
  if (c.from.kind == K::kPartial) return c.to.kind == K::kReplicate ? CommOp::kAllReduce : CommOp::kReduceScatter;
  if (c.from.kind == K::kShard) {
    if (c.to.kind == K::kPartial) throw std::invalid_argument(what + ": a shard does not become a partial sum");
    return c.to.kind == K::kReplicate ? CommOp::kAllGather : CommOp::kAllToAll;
  }
  return CommOp::kLocal;  // replicate -> shard (a cut) or partial (member 0 keeps it)
}

/// `dims` split into groups the mesh has, first all of them, else the
/// first alone and the rest the same way.
void split_into_groups(const ProcessMesh& mesh, CommOp op, std::vector<std::string> dims,
                       std::vector<CommStep>& out) {
  while (!dims.empty()) {
    const std::string g = mesh.flat_over(dims);
    if (!g.empty()) {
      out.push_back({op, dims, g});
      return;
    }
    out.push_back({op, {dims.front()}, dims.front()});
    dims.erase(dims.begin());
  }
}

/// The placements after `done` dimensions took their `to`, in the changes' order.
Placements state_after(const std::vector<Change>& changes, const std::vector<std::string>& done) {
  Placements out;
  for (const auto& c : changes) {
    const bool is_done = std::find(done.begin(), done.end(), c.dim) != done.end();
    out.push_back({c.dim, is_done ? c.to : c.from});
  }
  return out;
}

Box box_at(const ProcessMesh& mesh, const std::vector<std::int64_t>& shape, const Placements& pl, int rank) {
  const Part part = part_of(shape, pl, coords_of(mesh, pl, rank));
  if (part.boxes.size() != 1) throw std::invalid_argument("redistribute: a part of several boxes (head-tail)");
  return part.boxes[0];
}

/// a ∩ b, relative to `base` (a box holding it); lengths 0 when empty.
Box relative_overlap(const Box& a, const Box& b, const Box& base) {
  Box out;
  for (std::size_t d = 0; d < a.offsets.size(); ++d) {
    const std::int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    const std::int64_t hi = std::min(a.offsets[d] + a.lengths[d], b.offsets[d] + b.lengths[d]);
    out.offsets.push_back(std::max<std::int64_t>(0, lo - base.offsets[d]));
    out.lengths.push_back(std::max<std::int64_t>(0, hi - lo));
  }
  return out;
}

std::int64_t numel(const Box& b) {
  std::int64_t n = 1;
  for (auto l : b.lengths) n *= l;
  return n;
}

at::Tensor piece(const at::Tensor& t, const Box& b) {
  at::Tensor v = t;
  for (std::size_t d = 0; d < b.offsets.size(); ++d)
    v = v.narrow(static_cast<std::int64_t>(d), b.offsets[d], b.lengths[d]);
  return v;
}

}  // namespace

namespace {

/// The steps with the local changes `early` before the collectives and the
/// others after them.
std::vector<CommStep> ordered_steps(const ProcessMesh& mesh, const std::vector<Change>& changes,
                                    const std::vector<bool>& early) {
  std::vector<CommStep> steps;
  std::vector<std::string> first, last;
  for (std::size_t i = 0; i < changes.size(); ++i) {
    if (op_of(changes[i]) == CommOp::kLocal) (early[i] ? first : last).push_back(changes[i].dim);
  }
  if (!first.empty()) steps.push_back({CommOp::kLocal, first, ""});
  for (CommOp op : {CommOp::kAllReduce, CommOp::kReduceScatter, CommOp::kAllToAll, CommOp::kAllGather}) {
    std::vector<std::string> dims;
    for (const auto& c : changes)
      if (op_of(c) == op) dims.push_back(c.dim);
    split_into_groups(mesh, op, dims, steps);
  }
  if (!last.empty()) steps.push_back({CommOp::kLocal, last, ""});
  return steps;
}

/// Whether every step moves parts that nest, on every rank, for a tensor
/// whose every dimension splits unevenly: a reduce-scatter's new parts lie
/// inside the part each member holds, a gather's or all-to-all's pieces tile
/// the new part, a cut lies inside the part held.
bool nests(const ProcessMesh& mesh, const std::vector<Change>& changes, const std::vector<CommStep>& steps) {
  int ndim = 1;
  for (const auto& c : changes) ndim = std::max({ndim, c.from.dim + 1, c.to.dim + 1});
  const std::vector<std::int64_t> shape(static_cast<std::size_t>(ndim), 2 * mesh.world_size() + 1);
  std::vector<std::string> done;
  for (const auto& step : steps) {
    const Placements before = state_after(changes, done);
    done.insert(done.end(), step.dims.begin(), step.dims.end());
    const Placements after = state_after(changes, done);
    for (int r = 0; r < mesh.world_size(); ++r) {
      const Box b = box_at(mesh, shape, before, r), a = box_at(mesh, shape, after, r);
      if (step.op == CommOp::kLocal || step.op == CommOp::kAllReduce) {
        if (numel(relative_overlap(a, b, b)) != numel(a)) return false;
        continue;
      }
      std::int64_t got = 0;
      for (int m : mesh.group_ranks(step.group, r)) {
        if (step.op == CommOp::kReduceScatter) {
          const Box am = box_at(mesh, shape, after, m);
          if (numel(relative_overlap(am, b, b)) != numel(am)) return false;
        } else {
          got += numel(relative_overlap(box_at(mesh, shape, before, m), a, a));
        }
      }
      if (step.op != CommOp::kReduceScatter && got != numel(a)) return false;
    }
  }
  return true;
}

}  // namespace

std::vector<CommStep> plan_redistribute(const ProcessMesh& mesh, const Placements& from, const Placements& to) {
  const auto changes = changes_of(mesh, from, to);
  bool only_sums = true;
  std::size_t first_collective = changes.size();
  for (std::size_t i = 0; i < changes.size(); ++i) {
    const auto op = op_of(changes[i]);
    if (!op || *op == CommOp::kLocal) continue;
    first_collective = std::min(first_collective, i);
    only_sums = only_sums && (*op == CommOp::kAllReduce || *op == CommOp::kReduceScatter);
  }
  // Local changes first when they make a partial from a replica, or cut
  // outside the dimensions of collectives that are all sums (shards nest in
  // `to`'s order, so the sums then work inside the cut part, on less data);
  // the others after the collectives, cutting what they left.
  std::vector<bool> early(changes.size(), false);
  for (std::size_t i = 0; i < changes.size(); ++i)
    early[i] = changes[i].to.kind == Placement::Kind::kPartial || (only_sums && i < first_collective);
  auto steps = ordered_steps(mesh, changes, early);
  // Where a change is outside (before) another dimension whose shards cut
  // the same tensor dimension, in another step, the order of the steps
  // decides which ranges the shards cover: that order is checked on every
  // rank, and the first order of the steps that nests is taken (the same
  // on every rank: it depends on the placements and the mesh only). What
  // nests in no order is a move no step here makes.
  auto step_of = [&](const std::string& dim) {
    for (std::size_t k = 0; k < steps.size(); ++k)
      if (std::find(steps[k].dims.begin(), steps[k].dims.end(), dim) != steps[k].dims.end()) return int(k);
    return -1;
  };
  auto cuts = [](const Change& c, int d) {
    return (c.from.shards() && c.from.dim == d) || (c.to.shards() && c.to.dim == d);
  };
  bool interacts = false;
  for (std::size_t j = 0; j < changes.size() && !interacts; ++j) {
    for (std::size_t i = 0; i < j && !interacts; ++i) {
      if (changes[i].from == changes[i].to || step_of(changes[i].dim) == step_of(changes[j].dim)) continue;
      for (const Placement& p : {changes[j].from, changes[j].to})
        if (p.shards() && cuts(changes[i], p.dim)) interacts = true;
    }
  }
  if (!interacts) return steps;
  std::vector<std::size_t> order(steps.size());
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
  do {
    std::vector<CommStep> candidate;
    for (auto k : order) candidate.push_back(steps[k]);
    if (nests(mesh, changes, candidate)) return candidate;
  } while (std::next_permutation(order.begin(), order.end()));
  throw std::invalid_argument("redistribute " + describe(from) + " -> " + describe(to) +
                              ": the shards nest in another order before and after (a shard inside one that comes "
                              "or goes along the same tensor dimension); no order of steps makes that move");
}

/// Per step and item: what each member sends and receives.
struct Redistributor::Plan {
  struct ItemStep {
    Box before, after;            ///< this rank's boxes (global coordinates)
    std::vector<Box> send, recv;  ///< per member: relative to before / to after
    bool zero = false;            ///< kLocal to a partial at index > 0: zeros
  };
  struct Step {
    Group* group = nullptr;
    int me = 0, members = 1;
    std::vector<ItemStep> items;
  };
  std::vector<Step> steps;
  std::vector<std::vector<std::int64_t>> shapes;  ///< per item: this rank's part under `to`
  RedistributeOptions options;
};

Redistributor::Redistributor(DistributedContext& ctx, std::vector<RedistributeItem> items, RedistributeOptions options)
    : plan_(std::make_unique<Plan>()), items_(std::move(items)) {
  plan_->options = options;
  const ProcessMesh& mesh = ctx.mesh();
  for (std::size_t i = 0; i < items_.size(); ++i) {
    auto steps = plan_redistribute(mesh, items_[i].from, items_[i].to);
    if (i == 0) {
      steps_ = steps;
      continue;
    }
    bool same = steps.size() == steps_.size();
    for (std::size_t s = 0; same && s < steps.size(); ++s)
      same = steps[s].op == steps_[s].op && steps[s].group == steps_[s].group;
    if (!same) {
      throw std::invalid_argument("redistribute: a bucket's items need different steps (" + describe(steps_) +
                                  " against " + describe(steps) + ")");
    }
  }
  for (const auto& item : items_) plan_->shapes.push_back(box_at(mesh, item.global_shape, item.to, ctx.rank()).lengths);
  plan_->steps.resize(steps_.size());
  for (std::size_t s = 0; s < steps_.size(); ++s) {
    auto& step = plan_->steps[s];
    std::vector<int> ranks{ctx.rank()};
    if (!steps_[s].group.empty()) {
      step.group = &ctx.group(steps_[s].group);
      step.me = step.group->rank();
      step.members = step.group->size();
      ranks = step.group->global_ranks();
    }
    for (const auto& item : items_) {
      const auto changes = changes_of(mesh, item.from, item.to);
      std::vector<std::string> done_before, done_after;
      for (std::size_t k = 0; k <= s; ++k) {
        for (const auto& d : steps_[k].dims) {
          if (k < s) done_before.push_back(d);
          done_after.push_back(d);
        }
      }
      const Placements before = state_after(changes, done_before), after = state_after(changes, done_after);
      Plan::ItemStep is;
      is.before = box_at(mesh, item.global_shape, before, ctx.rank());
      is.after = box_at(mesh, item.global_shape, after, ctx.rank());
      if (steps_[s].op == CommOp::kLocal) {
        // A partial made from a replica: the member at index 0 of each such
        // dimension keeps the value, the others hold zeros.
        for (const auto& c : changes) {
          const auto& dims = steps_[s].dims;
          if (c.to.kind == Placement::Kind::kPartial && std::find(dims.begin(), dims.end(), c.dim) != dims.end())
            is.zero = is.zero || mesh.group_index(c.dim, ctx.rank()) != 0;
        }
        is.send.push_back(relative_overlap(is.after, is.before, is.before));
        if (numel(is.send[0]) != numel(is.after)) {
          throw std::invalid_argument("redistribute " + describe(item.from) + " -> " + describe(item.to) +
                                      ": the cut is not inside the part held (shards nest in the order given)");
        }
      } else {
        for (int r : ranks) {
          const Box b = box_at(mesh, item.global_shape, before, r), a = box_at(mesh, item.global_shape, after, r);
          is.send.push_back(relative_overlap(is.before, a, is.before));
          is.recv.push_back(relative_overlap(b, is.after, is.after));
        }
      }
      if (steps_[s].op != CommOp::kLocal && steps_[s].op != CommOp::kAllReduce) {
        // What the members send must be what each receives, piece by piece:
        // the parts tile (a reduce-scatter: every member's new part inside
        // the part each holds).
        std::int64_t got = 0;
        for (const auto& b : is.recv) got += numel(b);
        const bool tiles = steps_[s].op == CommOp::kReduceScatter
                               ? numel(is.send[static_cast<std::size_t>(step.me)]) == numel(is.after)
                               : got == numel(is.after);
        if (!tiles) {
          throw std::invalid_argument("redistribute " + describe(item.from) + " -> " + describe(item.to) + ": " +
                                      to_string(steps_[s].op) + " over " + steps_[s].group +
                                      " would not tile the parts (shards nest in the order given)");
        }
      }
      step.items.push_back(std::move(is));
    }
  }
}

Redistributor::~Redistributor() = default;
Redistributor::Redistributor(Redistributor&&) noexcept = default;
Redistributor& Redistributor::operator=(Redistributor&&) noexcept = default;

std::vector<std::int64_t> Redistributor::result_shape(std::size_t i) const { return plan_->shapes.at(i); }

namespace {

at::ScalarType sum_type(const RedistributeOptions& o, const at::Tensor& t) {
  return o.reduce_dtype == at::ScalarType::Undefined ? t.scalar_type() : o.reduce_dtype;
}

}  // namespace

std::unique_ptr<Redistributor::Pending> Redistributor::start(const std::vector<at::Tensor>& locals,
                                                             const at::Tensor& flat) const {
  if (locals.size() != items_.size()) {
    throw std::invalid_argument("redistribute: " + std::to_string(locals.size()) + " tensors for " +
                                std::to_string(items_.size()) + " items");
  }
  return issue(0, locals, flat);
}

std::unique_ptr<Redistributor::Pending> Redistributor::issue(std::size_t s, const std::vector<at::Tensor>& locals,
                                                             const at::Tensor& flat) const {
  c10::NoGradGuard no_grad;
  auto p = std::make_unique<Pending>();
  p->locals = locals;
  p->step = s;
  if (s >= steps_.size()) return p;
  const auto& step = plan_->steps[s];
  const CommOp op = steps_[s].op;
  const at::ScalarType st = locals.empty() ? at::kFloat : sum_type(plan_->options, locals[0]);
  auto cast = [&](const at::Tensor& t) { return t.scalar_type() == st ? t : t.to(st); };
  switch (op) {
    case CommOp::kAllReduce: {
      if (flat.defined()) {
        p->in_place = flat;
        p->buffer = cast(flat);
      } else {
        std::vector<at::Tensor> parts;
        for (const auto& t : locals) parts.push_back(cast(t).reshape({-1}));
        p->buffer = at::cat(parts);  // a copy: the caller's tensors are left alone
      }
      p->work = step.group->all_reduce_async(p->buffer);
      break;
    }
    case CommOp::kReduceScatter:
    case CommOp::kAllToAll: {
      std::vector<at::Tensor> parts;
      std::vector<std::int64_t> send(static_cast<std::size_t>(step.members), 0),
          recv(static_cast<std::size_t>(step.members), 0);
      for (int m = 0; m < step.members; ++m) {
        for (std::size_t i = 0; i < locals.size(); ++i) {
          const auto& is = step.items[i];
          const Box& b = is.send[static_cast<std::size_t>(m)];
          parts.push_back(cast(piece(locals[i], b)).reshape({-1}));
          send[static_cast<std::size_t>(m)] += numel(b);
          recv[static_cast<std::size_t>(m)] += numel(is.recv[static_cast<std::size_t>(m)]);
        }
      }
      p->buffer = at::cat(parts);
      if (op == CommOp::kReduceScatter) p->work = step.group->reduce_scatter_async(p->buffer, send);
      else p->work = step.group->all_to_all_async(p->buffer, send, recv);
      break;
    }
    case CommOp::kAllGather: {
      std::vector<at::Tensor> parts;
      std::vector<std::int64_t> totals(static_cast<std::size_t>(step.members), 0);
      for (std::size_t i = 0; i < locals.size(); ++i) {
        parts.push_back(locals[i].reshape({-1}));
        for (int m = 0; m < step.members; ++m)
          totals[static_cast<std::size_t>(m)] += numel(step.items[i].recv[static_cast<std::size_t>(m)]);
      }
      p->buffer = parts.size() == 1 ? parts[0].contiguous() : at::cat(parts);
      p->gather.emplace(all_gather_uneven_async(*step.group, p->buffer, 0, totals));
      break;
    }
    case CommOp::kLocal: break;
  }
  return p;
}

std::vector<at::Tensor> Redistributor::finish(std::unique_ptr<Pending> p, const std::vector<at::Tensor>& into) const {
  c10::NoGradGuard no_grad;
  std::vector<at::Tensor> cur = std::move(p->locals);
  for (std::size_t s = 0; s < steps_.size(); ++s) {
    if (s > 0) {  // the later steps, each issued on the last one's results
      auto next = issue(s, cur, at::Tensor());
      p->buffer = next->buffer;
      p->work = std::move(next->work);
      p->gather = std::move(next->gather);
      p->in_place = at::Tensor();
    }
    p->step = s;
    const auto& step = plan_->steps[s];
    const bool last = s + 1 == steps_.size();
    auto target = [&](std::size_t i) -> at::Tensor {
      if (last && i < into.size() && into[i].defined()) return into[i];
      return at::empty(step.items[i].after.lengths, cur[i].options());
    };
    std::vector<at::Tensor> out(cur.size());
    switch (steps_[s].op) {
      case CommOp::kAllReduce: {
        at::Tensor sum = p->work->wait();
        if (p->in_place.defined()) {
          if (!sum.is_same(p->in_place)) p->in_place.copy_(sum);
          out = cur;  // the locals view the flat
        } else {
          std::int64_t off = 0;
          for (std::size_t i = 0; i < cur.size(); ++i) {
            const auto n = cur[i].numel();
            at::Tensor v = sum.narrow(0, off, n).view(cur[i].sizes());
            out[i] = v.scalar_type() == cur[i].scalar_type() ? v : v.to(cur[i].scalar_type());
            off += n;
          }
        }
        break;
      }
      case CommOp::kReduceScatter: {
        at::Tensor mine = p->work->wait();
        std::int64_t off = 0;
        for (std::size_t i = 0; i < cur.size(); ++i) {
          const auto& shape = step.items[i].after.lengths;
          const std::int64_t n = numel(step.items[i].after);
          at::Tensor v = mine.narrow(0, off, n).view(shape);
          if (v.scalar_type() != cur[i].scalar_type()) v = v.to(cur[i].scalar_type());
          out[i] = v;
          off += n;
        }
        break;
      }
      case CommOp::kAllToAll: {
        at::Tensor got = p->work->wait();
        for (std::size_t i = 0; i < cur.size(); ++i) out[i] = target(i);
        std::int64_t off = 0;
        for (int m = 0; m < step.members; ++m) {
          for (std::size_t i = 0; i < cur.size(); ++i) {
            const Box& b = step.items[i].recv[static_cast<std::size_t>(m)];
            const std::int64_t n = numel(b);
            at::Tensor dst = piece(out[i], b);
            dst.copy_(got.narrow(0, off, n).view(dst.sizes()));
            off += n;
          }
        }
        break;
      }
      case CommOp::kAllGather: {
        const auto all = p->gather->wait();
        for (std::size_t i = 0; i < cur.size(); ++i) out[i] = target(i);
        for (int m = 0; m < step.members; ++m) {
          std::int64_t off = 0;
          for (std::size_t i = 0; i < cur.size(); ++i) {
            const Box& b = step.items[i].recv[static_cast<std::size_t>(m)];
            const std::int64_t n = numel(b);
            at::Tensor dst = piece(out[i], b);
            at::Tensor src = all[static_cast<std::size_t>(m)].narrow(0, off, n);
            // This member's own part may already be where it belongs.
            if (!(m == step.me && dst.is_contiguous() && dst.data_ptr() == cur[i].data_ptr()))
              dst.copy_(src.view(dst.sizes()));
            off += n;
          }
        }
        break;
      }
      case CommOp::kLocal: {
        for (std::size_t i = 0; i < cur.size(); ++i) {
          const auto& is = step.items[i];
          out[i] = is.zero ? at::zeros(is.after.lengths, cur[i].options()) : piece(cur[i], is.send[0]);
        }
        break;
      }
    }
    p->work.reset();
    p->gather.reset();
    cur = std::move(out);
  }
  for (std::size_t i = 0; i < cur.size() && i < into.size(); ++i) {
    if (into[i].defined() && !cur[i].is_same(into[i])) const_cast<at::Tensor&>(into[i]).copy_(cur[i]);
  }
  return cur;
}

std::vector<at::Tensor> Redistributor::run(const std::vector<at::Tensor>& locals,
                                           const std::vector<at::Tensor>& into) const {
  return finish(start(locals), into);
}

at::Tensor redistribute(DistributedContext& ctx, const at::Tensor& local, const std::vector<std::int64_t>& global_shape,
                        const Placements& from, const Placements& to, RedistributeOptions options) {
  Redistributor r(ctx, {RedistributeItem{global_shape, from, to}}, options);
  return r.run({local})[0];
}

}  // namespace hp::dist
