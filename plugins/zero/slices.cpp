#include "plugins/zero/slices.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <map>

#include "hp/comm/context.h"
#include "hp/comm/group.h"
#include "hp/comm/mesh.h"
#include "hp/optim/buckets.h"

namespace hp::zero {

SlicePlan::SlicePlan(const std::vector<ParamEntry>& params, dist::DistributedContext& d, ZeroOptions o)
    : dist(&d), options(o) {
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
      if (!this->options.parts.release_full_grads && !p.tensor.grad().defined()) p.tensor.mutable_grad() = at::zeros_like(p.tensor);
      // Where the reduced slice lands. Released full gradients (stages 2
      // and 3) over a group of more members: storage of its own, made now
      // among the model state, into which each reduction copies. Taking
      // the reduction's output buffer itself left a block made in backward
      // held until the next step's backward, among the activations (the GPT
      // 4 x 256, stage 2 at 2 ranks, micro-batch 2: the pool's extent 11 MiB
      // above its most in use). Otherwise a placeholder with the slice's
      // shape (the optimizer's state is made from it) that the first
      // reduction replaces: one element seen at every position, never
      // written (one of the slice's bytes left, once replaced, holes among
      // the model state that no later block fitted: 21 MiB of them on the
      // GPT 6 x 384 under stage 1 at 2 ranks).
      const std::vector<std::int64_t> sizes = c.slice_of(p.tensor, c.me).sizes().vec();
      c.own_slice_grad = this->options.parts.release_full_grads && g.size() > 1;
      c.slice_grad = c.own_slice_grad ? at::zeros(sizes, p.tensor.options())
                                      : at::zeros({}, p.tensor.options()).expand(sizes);
      cuts.push_back(std::move(c));
    }
}

namespace {
/// Gradient sums crossing in the policy's reduce type (fp32: as themselves).
dist::RedistributeOptions zero_sum_options(const ZeroOptions& o) {
  dist::RedistributeOptions r;
  if (o.reduce_dtype != at::kFloat) r.reduce_dtype = o.reduce_dtype;
  return r;
}
}  // namespace

std::vector<std::pair<std::vector<std::size_t>, std::string>> SlicePlan::bucket_cuts() const {
  std::map<std::pair<std::vector<std::string>, std::string>, std::vector<std::size_t>> by_group;
  for (std::size_t i = cuts.size(); i-- > 0;) by_group[{cuts[i].partial, cuts[i].shard_group}].push_back(i);
  std::vector<std::pair<std::vector<std::size_t>, std::string>> out;
  for (const auto& [key, idx] : by_group) {
    std::vector<double> bytes;
    for (std::size_t i : idx) bytes.push_back(static_cast<double>(cuts[i].param.tensor.nbytes()));
    for (const auto& run : cut_buckets(bytes, options.bucket_bytes)) {
      std::vector<std::size_t> held;
      for (std::size_t k : run) held.push_back(idx[k]);
      out.emplace_back(std::move(held), key.second);
    }
  }
  return out;
}

std::vector<Bucket> SlicePlan::buckets() const {
  std::vector<Bucket> out;
  for (auto& [held, group] : bucket_cuts()) {
    Bucket b;
    b.group = group;
    std::vector<dist::RedistributeItem> items;
    for (std::size_t i : held) {
      const Cut& c = cuts[i];
      items.push_back({c.param.spec.global_shape, c.param.spec.grad, c.slice_spec.placements});
    }
    b.cuts = std::move(held);
    b.redist = std::make_shared<dist::Redistributor>(*dist, std::move(items), zero_sum_options(options));
    const auto& steps = b.redist->steps();
    b.hooked = steps.size() == 1 && steps[0].op == dist::CommOp::kReduceScatter;
    out.push_back(std::move(b));
  }
  return out;
}

std::vector<ParamEntry> SlicePlan::gradients() const {
  std::vector<ParamEntry> out;
  for (const auto& c : cuts) out.push_back({c.slice_spec, c.slice_grad});
  return out;
}

bool SlicePlan::per_block(const Cut& c) const {
  return options.parts.shard_params && dist->group(c.shard_group).size() > 1;
}

dist::UnevenGather SlicePlan::gather_slices(const std::string& group, const std::vector<std::size_t>& idx,
                                 const std::function<at::Tensor(const Cut&)>& mine, at::Tensor flat) {
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

void SlicePlan::place_slices(const std::vector<std::size_t>& idx, const std::vector<at::Tensor>& all, int skip,
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

double SlicePlan::param_bytes_held() const {
  double n = 0;
  for (const auto& c : cuts) n += static_cast<double>(c.param.tensor.storage().nbytes());
  for (const auto& c : cuts) {
    if (c.shard.defined()) n += static_cast<double>(c.shard.nbytes());
  }
  return n;
}

}  // namespace hp::zero
