#include "hp/comm/mesh.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <sstream>
#include <stdexcept>

namespace hp::dist {

namespace {

const std::string kWorld = "world";

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

std::string ranks_text(const std::vector<int>& r) {
  std::string out;
  for (std::size_t i = 0; i < r.size(); ++i) out += (i ? "," : "") + std::to_string(r[i]);
  return out;
}

long long product(const std::vector<int>& v) {
  long long p = 1;
  for (int x : v) p *= x;
  return p;
}

int role_rank(MeshRole r) {
  switch (r) {
    case MeshRole::kSplit: return 0;
    case MeshRole::kSequence: return 1;
    case MeshRole::kReplicate: return 2;
    case MeshRole::kPartition: return 3;
  }
  return 4;
}

}  // namespace

std::vector<std::string> order_dims(const std::string& order) {
  std::vector<std::string> out;
  if (order.empty()) return out;
  std::stringstream ss(order);
  for (std::string part; std::getline(ss, part, '-');) out.push_back(part);
  return out;
}

const char* to_string(MeshRole role) {
  switch (role) {
    case MeshRole::kPartition: return "partition";
    case MeshRole::kSplit: return "split";
    case MeshRole::kReplicate: return "replicate";
    case MeshRole::kSequence: return "sequence";
  }
  return "?";
}

const std::string& ProcessMesh::data_dim() {
  static const std::string kData = "dp";
  return kData;
}

std::string ProcessMesh::carve_remainder(const std::string& dim) {
  std::string stem = dim;
  if (stem.size() > 1 && stem.back() == 'p') stem.pop_back();
  return stem + data_dim();
}

ProcessMesh::ProcessMesh() : ProcessMesh({MeshDim{data_dim(), 1, MeshRole::kReplicate, ""}}) {}

ProcessMesh::ProcessMesh(std::vector<MeshDim> dims, std::vector<MeshView> views, std::vector<MeshFlat> flats)
    : dims_(std::move(dims)), views_(std::move(views)), flats_(std::move(flats)) {
  std::set<std::string> names{kWorld};
  auto add_name = [&](const std::string& n) {
    if (n.empty()) throw std::invalid_argument("a mesh dimension has an empty name");
    if (!names.insert(n).second) throw std::invalid_argument("mesh name '" + n + "' is used twice");
  };
  int partitions = 0;
  world_ = 1;
  for (const auto& d : dims_) {
    add_name(d.name);
    if (d.size < 1) {
      throw std::invalid_argument("mesh dimension " + d.name + " has size " + std::to_string(d.size) +
                                  ": every size is at least 1");
    }
    if (d.role == MeshRole::kPartition) ++partitions;
    world_ *= d.size;
  }
  if (partitions > 1) throw std::invalid_argument("a mesh has at most one partition dimension");
  for (auto& v : views_) {
    long long covered = 1;
    for (const auto& o : v.over) {
      auto it = std::find_if(dims_.begin(), dims_.end(), [&](const MeshDim& d) { return d.name == o; });
      if (it == dims_.end()) {
        throw std::invalid_argument("view '" + v.name + "' covers '" + o + "', which is not a base dimension (" +
                                    order() + ")");
      }
      covered *= it->size;
    }
    // Covered dimensions in mesh order, so a view coordinate grows with the rank.
    std::sort(v.over.begin(), v.over.end(), [&](const std::string& a, const std::string& b) {
      auto pos = [&](const std::string& n) {
        return std::find_if(dims_.begin(), dims_.end(), [&](const MeshDim& d) { return d.name == n; }) -
               dims_.begin();
      };
      return pos(a) < pos(b);
    });
    long long own = 1;
    for (const auto& d : v.dims) {
      add_name(d.name);
      if (d.size < 1) {
        throw std::invalid_argument("view '" + v.name + "' dimension " + d.name + " has size " +
                                    std::to_string(d.size));
      }
      own *= d.size;
    }
    if (own != covered) {
      throw std::invalid_argument("view '" + v.name + "' factors " + std::to_string(covered) + " ranks (" +
                                  join(v.over, " x ") + ") into " + std::to_string(own));
    }
  }
  for (const auto& f : flats_) {
    add_name(f.name);
    Where w;
    for (const auto& d : f.dims) {
      Where one;
      if (!locate(d, one) || one.dims.size() != 1) {
        throw std::invalid_argument("flat group '" + f.name + "' joins '" + d + "', which is not a mesh dimension");
      }
      if (!w.dims.empty() && w.view != one.view) {
        throw std::invalid_argument("flat group '" + f.name + "' joins dimensions of different views");
      }
      w.view = one.view;
      w.dims.push_back(one.dims[0]);
    }
    if (f.dims.empty()) throw std::invalid_argument("flat group '" + f.name + "' joins no dimension");
  }
  add_role_flats(names);
}

void ProcessMesh::add_role_flats(std::set<std::string>& names) {
  // Every role is served by one group even when several dimensions have it:
  // the replicate dimensions (sums over the replicas), and the replicate
  // with the sequence dimensions (gradient sums), of the base and of each
  // view. A set of one dimension is that dimension's group; dimensions of
  // size 1 take no part.
  auto wanted = [](const std::vector<MeshDim>& ds, bool with_sequence) {
    std::vector<std::string> out;
    for (const auto& d : ds) {
      if (d.size > 1 && (d.role == MeshRole::kReplicate || (with_sequence && d.role == MeshRole::kSequence)))
        out.push_back(d.name);
    }
    return out;
  };
  std::vector<std::vector<std::string>> sets;
  for (bool seq : {false, true}) {
    sets.push_back(wanted(dims_, seq));
    for (const auto& v : views_) sets.push_back(wanted(v.dims, seq));
  }
  for (const auto& set : sets) {
    if (set.size() < 2 || !flat_over(set).empty()) continue;
    const std::string name = join(set, "_");
    if (names.count(name) != 0) continue;  // a name taken: the dimensions are summed one after another
    names.insert(name);
    flats_.push_back(MeshFlat{name, set, ""});
  }
}

std::string ProcessMesh::flat_over(const std::vector<std::string>& dims) const {
  std::vector<std::string> want;
  for (const auto& d : dims) {
    if (group_size(d) > 1) want.push_back(d);
  }
  if (want.empty()) return "";
  if (want.size() == 1) return want[0];
  std::sort(want.begin(), want.end());
  for (const auto& f : flats_) {
    std::vector<std::string> have;
    for (const auto& d : f.dims) {
      if (group_size(d) > 1) have.push_back(d);
    }
    std::sort(have.begin(), have.end());
    if (have == want) return f.name;
  }
  return "";
}

std::string ProcessMesh::order() const {
  std::vector<std::string> n;
  for (const auto& d : dims_) n.push_back(d.name);
  return join(n, "-");
}

bool ProcessMesh::locate(const std::string& name, Where& where) const {
  where = Where{};
  if (name == kWorld) {
    for (std::size_t i = 0; i < dims_.size(); ++i) where.dims.push_back(static_cast<int>(i));
    return true;
  }
  for (std::size_t i = 0; i < dims_.size(); ++i) {
    if (dims_[i].name == name) {
      where.dims = {static_cast<int>(i)};
      return true;
    }
  }
  for (std::size_t v = 0; v < views_.size(); ++v) {
    const auto& vd = views_[v].dims;
    for (std::size_t i = 0; i < vd.size(); ++i) {
      if (vd[i].name == name) {
        where.view = static_cast<int>(v);
        where.dims = {static_cast<int>(i)};
        return true;
      }
    }
  }
  for (const auto& f : flats_) {
    if (f.name != name) continue;
    for (const auto& d : f.dims) {
      Where one;
      locate(d, one);
      where.view = one.view;
      where.dims.push_back(one.dims[0]);
    }
    return true;
  }
  return false;
}

bool ProcessMesh::has(const std::string& name) const {
  Where w;
  return locate(name, w);
}

const MeshDim* ProcessMesh::find(const std::string& name) const {
  for (const auto& d : dims_)
    if (d.name == name) return &d;
  for (const auto& v : views_)
    for (const auto& d : v.dims)
      if (d.name == name) return &d;
  return nullptr;
}

std::vector<std::string> ProcessMesh::group_names() const {
  std::vector<std::string> out{kWorld};
  for (const auto& d : dims_) out.push_back(d.name);
  for (const auto& v : views_)
    for (const auto& d : v.dims) out.push_back(d.name);
  for (const auto& f : flats_) out.push_back(f.name);
  return out;
}

std::vector<int> ProcessMesh::base_coords(int rank) const {
  std::vector<int> c(dims_.size());
  for (std::size_t i = 0; i < dims_.size(); ++i) {
    c[i] = rank % dims_[i].size;
    rank /= dims_[i].size;
  }
  return c;
}

int ProcessMesh::rank_of(const std::vector<int>& base) const {
  int r = 0;
  for (std::size_t i = dims_.size(); i-- > 0;) r = r * dims_[i].size + base[i];
  return r;
}

std::vector<int> ProcessMesh::view_coords(int v, const std::vector<int>& base) const {
  const auto& view = views_[static_cast<std::size_t>(v)];
  // Flattened index over the covered dimensions, innermost first.
  long long flat = 0, stride = 1;
  for (const auto& o : view.over) {
    const auto i = static_cast<std::size_t>(
        std::find_if(dims_.begin(), dims_.end(), [&](const MeshDim& d) { return d.name == o; }) - dims_.begin());
    flat += base[i] * stride;
    stride *= dims_[i].size;
  }
  std::vector<int> c;
  for (const auto& d : view.dims) {
    c.push_back(static_cast<int>(flat % d.size));
    flat /= d.size;
  }
  return c;
}

std::vector<int> ProcessMesh::sizes_of(const Where& w) const {
  std::vector<int> s;
  for (int i : w.dims) {
    s.push_back(w.view < 0 ? dims_[static_cast<std::size_t>(i)].size
                           : views_[static_cast<std::size_t>(w.view)].dims[static_cast<std::size_t>(i)].size);
  }
  return s;
}

std::vector<int> ProcessMesh::group_ranks(const std::string& name, int rank) const {
  Where w;
  if (!locate(name, w)) {
    throw std::invalid_argument("mesh has no group '" + name + "' (it has " + join(group_names(), ", ") + ")");
  }
  // The ranks whose coordinates, in the group's coordinate system, equal
  // `rank`'s on every dimension outside the group: `rank`'s coordinates
  // with the group's dimensions run through every value (O(group size),
  // not a scan of the world).
  const auto base = base_coords(rank);
  const auto sizes = sizes_of(w);
  std::vector<int> out;
  out.reserve(static_cast<std::size_t>(product(sizes)));
  std::vector<int> at(w.dims.size(), 0);
  std::vector<int> over_index;  // a view's covered base dimensions, in `over` order
  std::vector<int> vc;
  if (w.view >= 0) {
    const auto& view = views_[static_cast<std::size_t>(w.view)];
    for (const auto& o : view.over)
      over_index.push_back(static_cast<int>(
          std::find_if(dims_.begin(), dims_.end(), [&](const MeshDim& d) { return d.name == o; }) - dims_.begin()));
    vc = view_coords(w.view, base);
  }
  while (true) {
    auto b = base;
    if (w.view < 0) {
      for (std::size_t i = 0; i < w.dims.size(); ++i) b[static_cast<std::size_t>(w.dims[i])] = at[i];
    } else {
      // The view's coordinates with the group's changed, flattened (view
      // dimensions innermost first) and cut back into the covered base
      // dimensions (in `over` order, innermost first), as view_coords reads them.
      auto c = vc;
      for (std::size_t i = 0; i < w.dims.size(); ++i) c[static_cast<std::size_t>(w.dims[i])] = at[i];
      const auto& view = views_[static_cast<std::size_t>(w.view)];
      long long flat = 0, stride = 1;
      for (std::size_t i = 0; i < c.size(); ++i) {
        flat += c[i] * stride;
        stride *= view.dims[i].size;
      }
      for (int i : over_index) {
        const int n = dims_[static_cast<std::size_t>(i)].size;
        b[static_cast<std::size_t>(i)] = static_cast<int>(flat % n);
        flat /= n;
      }
    }
    out.push_back(rank_of(b));
    std::size_t k = 0;
    for (; k < at.size(); ++k) {
      if (++at[k] < sizes[k]) break;
      at[k] = 0;
    }
    if (k == at.size()) break;
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::vector<int>> ProcessMesh::all_groups(const std::string& name) const {
  std::vector<std::vector<int>> groups;
  std::vector<bool> seen(static_cast<std::size_t>(world_), false);
  for (int r = 0; r < world_; ++r) {
    if (seen[static_cast<std::size_t>(r)]) continue;
    auto g = group_ranks(name, r);
    for (int m : g) seen[static_cast<std::size_t>(m)] = true;
    groups.push_back(std::move(g));
  }
  return groups;
}

int ProcessMesh::group_size(const std::string& name) const {
  Where w;
  if (!locate(name, w)) return 0;
  return static_cast<int>(product(sizes_of(w)));
}

int ProcessMesh::group_index(const std::string& name, int rank) const {
  const auto members = group_ranks(name, rank);
  return static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
}

std::vector<std::string> ProcessMesh::dims_with(MeshRole role) const {
  std::vector<std::string> out;
  for (const auto& d : dims_)
    if (d.role == role) out.push_back(d.name);
  for (const auto& v : views_)
    for (const auto& d : v.dims)
      if (d.role == role) out.push_back(d.name);
  return out;
}

std::string ProcessMesh::partition_dim() const {
  for (const auto& d : dims_)
    if (d.role == MeshRole::kPartition) return d.name;
  return "";
}

std::vector<std::string> ProcessMesh::data_dims() const {
  std::vector<std::string> out;
  for (const auto& d : dims_)
    if (d.role == MeshRole::kReplicate || d.role == MeshRole::kSequence) out.push_back(d.name);
  return out;
}

std::vector<std::string> ProcessMesh::replicate_dims() const {
  std::vector<std::string> out;
  for (const auto& d : dims_)
    if (d.role == MeshRole::kReplicate) out.push_back(d.name);
  return out;
}

std::vector<std::string> ProcessMesh::grad_sync_dims(const std::vector<std::string>& shard_dims) const {
  std::vector<std::string> out;
  std::vector<const MeshView*> along;
  for (const auto& v : views_) {
    for (const auto& d : v.dims) {
      if (std::find(shard_dims.begin(), shard_dims.end(), d.name) != shard_dims.end()) {
        along.push_back(&v);
        break;
      }
    }
  }
  for (const auto& d : data_dims()) {
    const MeshView* covering = nullptr;
    for (const auto* v : along) {
      if (std::find(v->over.begin(), v->over.end(), d) != v->over.end()) covering = v;
    }
    if (covering == nullptr) {
      out.push_back(d);
      continue;
    }
    for (const auto& vd : covering->dims) {
      if ((vd.role == MeshRole::kReplicate || vd.role == MeshRole::kSequence) &&
          std::find(out.begin(), out.end(), vd.name) == out.end()) {
        out.push_back(vd.name);
      }
    }
  }
  return out;
}

int ProcessMesh::replica_rank(int rank) const {
  const auto c = base_coords(rank);
  int index = 0, stride = 1;
  for (std::size_t i = 0; i < dims_.size(); ++i) {
    if (dims_[i].role != MeshRole::kReplicate) continue;
    index += c[i] * stride;
    stride *= dims_[i].size;
  }
  return index;
}

int ProcessMesh::replicas() const {
  int n = 1;
  for (const auto& d : dims_)
    if (d.role == MeshRole::kReplicate) n *= d.size;
  return n;
}

bool ProcessMesh::is_leader(int rank) const {
  const auto c = base_coords(rank);
  for (std::size_t i = 0; i < dims_.size(); ++i)
    if (dims_[i].role != MeshRole::kPartition && c[i] != 0) return false;
  return true;
}

std::vector<int> ProcessMesh::leaders() const {
  std::vector<int> out;
  for (int r = 0; r < world_; ++r)
    if (is_leader(r)) out.push_back(r);
  return out;
}

std::map<std::string, int> ProcessMesh::sizes() const {
  std::map<std::string, int> out;
  for (const auto& d : dims_) out[d.name] = d.size;
  for (const auto& v : views_)
    for (const auto& d : v.dims) out[d.name] = d.size;
  return out;
}

std::string ProcessMesh::shape() const {
  std::vector<std::string> parts;
  for (std::size_t i = dims_.size(); i-- > 0;) parts.push_back(dims_[i].name + "=" + std::to_string(dims_[i].size));
  for (const auto& v : views_)
    for (const auto& d : v.dims) parts.push_back(d.name + "=" + std::to_string(d.size));
  return join(parts, " ");
}

std::string ProcessMesh::tag(int rank) const {
  const auto c = base_coords(rank);
  std::vector<std::string> parts;
  for (std::size_t i = dims_.size(); i-- > 0;) parts.push_back(dims_[i].name + std::to_string(c[i]));
  return join(parts, " ");
}

std::string ProcessMesh::describe(bool all_ranks) const {
  std::ostringstream os;
  os << "mesh " << shape() << " (world " << world_ << "), order " << order() << " (innermost first)\n";
  for (const auto& d : dims_) {
    os << "  dimension " << d.name << " = " << d.size << ", " << to_string(d.role)
       << (d.by.empty() ? std::string(" (data parallel remainder)") : " (" + d.by + ")") << "\n";
  }
  for (const auto& v : views_) {
    os << "  view " << v.name << " over " << join(v.over, " x ") << ":";
    for (const auto& d : v.dims) os << " " << d.name << " = " << d.size << " " << to_string(d.role) << ";";
    os << " (" << v.by << ")\n";
  }
  for (const auto& f : flats_) os << "  flat group " << f.name << " = " << join(f.dims, " x ") << " ("
                              << (f.by.empty() ? std::string("the mesh: one role") : f.by) << ")\n";
  // A few members of a group, for lines that must stay readable at any size.
  auto some = [](const std::vector<int>& g) {
    if (g.size() <= 8) return ranks_text(g);
    return ranks_text({g.begin(), g.begin() + 4}) + ",...," + ranks_text({g.end() - 2, g.end()});
  };
  for (const auto& g : group_names()) {
    if (g == kWorld) continue;
    const int size = group_size(g);
    os << "  groups " << g << ": " << world_ / size << " of " << size << "; rank 0 in [" << some(group_ranks(g, 0))
       << "], rank " << world_ - 1 << " in [" << some(group_ranks(g, world_ - 1)) << "]\n";
  }
  if (!all_ranks && world_ > kRankLines) {
    os << "  (" << world_ << " ranks: one line each with --dry-run --all-ranks)\n";
    return os.str();
  }
  for (int r = 0; r < world_; ++r) {
    const auto base = base_coords(r);
    os << "  rank " << r << " ->";
    for (std::size_t i = dims_.size(); i-- > 0;) os << " " << dims_[i].name << " " << base[i] << (i ? "," : "");
    for (std::size_t v = 0; v < views_.size(); ++v) {
      const auto vc = view_coords(static_cast<int>(v), base);
      for (std::size_t i = 0; i < vc.size(); ++i) os << ", " << views_[v].dims[i].name << " " << vc[i];
    }
    os << " ->";
    for (const auto& g : group_names()) {
      if (g == kWorld) continue;
      os << " " << g << "[" << ranks_text(group_ranks(g, r)) << "]";
    }
    os << "\n";
  }
  return os.str();
}

// --- planning -------------------------------------------------------------

bool MeshPlan::name_taken(const std::string& name, const std::string& feature) {
  if (name == kWorld || name == ProcessMesh::data_dim()) {
    conflicts.push_back("mesh dimension '" + name + "' claimed by '" + feature +
                        "' is the mesh's own (world, and the data-parallel remainder " + ProcessMesh::data_dim() +
                        "); pick another name");
    return true;
  }
  std::string by;
  if (auto it = claims.find(name); it != claims.end()) by = it->second.by;
  for (const auto& v : views)
    for (const auto& d : v.dims)
      if (d.name == name) by = v.by;
  for (const auto& f : flats)
    if (f.name == name) by = f.by;
  if (!by.empty()) {
    conflicts.push_back("mesh dimension '" + name + "' is claimed by both '" + by + "' and '" + feature + "'");
    return true;
  }
  return false;
}

void MeshPlan::claim(const std::string& dim, int size, const std::string& feature, MeshRole role) {
  if (name_taken(dim, feature)) return;
  if (role == MeshRole::kPartition) {
    for (const auto& [name, c] : claims) {
      if (c.role == MeshRole::kPartition) {
        conflicts.push_back("mesh dimension '" + dim + "' claimed by '" + feature +
                            "' as partition, but '" + name + "' (" + c.by +
                            ") already partitions the model: a mesh has one partition dimension");
        return;
      }
    }
  }
  claims[dim] = Claim{size, feature, role};
}

void MeshPlan::carve(const std::string& dim, int size, const std::string& feature, MeshRole role) {
  view(MeshView{feature,
                {ProcessMesh::data_dim()},
                {MeshDim{dim, size, role, feature},
                 MeshDim{ProcessMesh::carve_remainder(dim), 0, MeshRole::kReplicate, feature}},
                feature, /*with_sequence=*/true});
}

void MeshPlan::view(MeshView v) {
  for (const auto& d : v.dims)
    if (name_taken(d.name, v.by)) return;
  for (const auto& other : views) {
    if (other.name == v.name) {
      conflicts.push_back("mesh view '" + v.name + "' is declared twice ('" + other.by + "' and '" + v.by + "')");
      return;
    }
  }
  int remainders = 0;
  for (const auto& d : v.dims) remainders += d.size == 0;
  if (remainders > 1) {
    conflicts.push_back("mesh view '" + v.name + "' of '" + v.by + "' leaves " + std::to_string(remainders) +
                        " sizes open; at most one dimension of a view takes what the others leave");
    return;
  }
  views.push_back(std::move(v));
}

void MeshPlan::flatten(const std::string& name, std::vector<std::string> dims, const std::string& feature) {
  if (name_taken(name, feature)) return;
  flats.push_back(MeshFlat{name, std::move(dims), feature});
}

int MeshPlan::size_of(const std::string& dim) const {
  if (auto it = claims.find(dim); it != claims.end()) return it->second.size;
  for (const auto& v : views)
    for (const auto& d : v.dims)
      if (d.name == dim) return d.size;
  if (dim == ProcessMesh::data_dim() && replicas > 0) return replicas;
  return 1;
}

bool resolve_mesh(MeshPlan& plan, int world, int dp, ProcessMesh& mesh, MeshProblem& problem) {
  const std::string& data = ProcessMesh::data_dim();
  long long claimed = 1;
  std::string listed, names;
  for (const auto& [name, c] : plan.claims) {
    claimed *= c.size;
    listed += (listed.empty() ? "" : ", ") + name + "=" + std::to_string(c.size) + " (" + c.by + ")";
    names += " x " + name;
  }
  const std::string shape = "[" + (listed.empty() ? std::string("no dimension claimed") : listed) + "]";
  if (dp == 0) {
    if (claimed < 1 || world % claimed != 0) {
      problem = {"distributed", "world size " + std::to_string(world),
                 "world size must equal " + data + names + ", but " + std::to_string(world) +
                     " is not a multiple of the claimed sizes' product " + std::to_string(claimed) + " " + shape,
                 "a world size that is a multiple of " + std::to_string(claimed) + ", or other feature sizes"};
      return false;
    }
    dp = static_cast<int>(world / claimed);
  } else if (claimed * dp != world) {
    std::string product = std::to_string(dp);
    for (const auto& [name, c] : plan.claims) product += " x " + std::to_string(c.size);
    problem = {"distributed.data_parallel_size", std::to_string(dp),
               "world size " + std::to_string(world) + " != " + data + names + " = " + product + " " + shape,
               world % claimed == 0 ? std::to_string(world / claimed) + " or 0 (derive)"
                                    : "0 (derive), after fixing the feature sizes to divide " + std::to_string(world)};
    return false;
  }

  std::vector<MeshDim> dims;
  for (const auto& [name, c] : plan.claims) dims.push_back(MeshDim{name, c.size, c.role, c.by});
  dims.push_back(MeshDim{data, dp, MeshRole::kReplicate, ""});
  if (plan.order.empty()) {
    std::stable_sort(dims.begin(), dims.end(), [](const MeshDim& a, const MeshDim& b) {
      if (role_rank(a.role) != role_rank(b.role)) return role_rank(a.role) < role_rank(b.role);
      if (a.by.empty() != b.by.empty()) return b.by.empty();  // the data dimension after claimed replicas
      return a.name < b.name;
    });
  } else {
    const std::vector<std::string> want = order_dims(plan.order);
    std::string all;
    for (const auto& d : dims) all += (all.empty() ? "" : ", ") + d.name;
    std::vector<MeshDim> ordered;
    for (const auto& w : want) {
      auto it = std::find_if(dims.begin(), dims.end(), [&](const MeshDim& d) { return d.name == w; });
      if (it == dims.end()) {
        problem = {"distributed.mesh_order", plan.order,
                   "names '" + w + "', which is not a dimension of this run (or is named twice)",
                   "the dimensions " + all + ", each once, joined by '-', innermost first"};
        return false;
      }
      ordered.push_back(*it);
      dims.erase(it);
    }
    if (!dims.empty()) {
      problem = {"distributed.mesh_order", plan.order, "leaves out '" + dims.front().name + "'",
                 "the dimensions " + all + ", each once, joined by '-', innermost first"};
      return false;
    }
    dims = std::move(ordered);
  }

  std::vector<MeshView> views = plan.views;
  for (auto& v : views) {
    if (v.with_sequence) {
      for (const auto& d : dims)
        if (d.role == MeshRole::kSequence && std::find(v.over.begin(), v.over.end(), d.name) == v.over.end())
          v.over.push_back(d.name);
      v.with_sequence = false;
    }
    long long covered = 1;
    std::string over_text;
    for (const auto& o : v.over) {
      auto it = std::find_if(dims.begin(), dims.end(), [&](const MeshDim& d) { return d.name == o; });
      if (it == dims.end()) {
        problem = {"features." + v.by, v.name, "the view covers '" + o + "', which no enabled feature claims",
                   "a view over the dimensions " + ProcessMesh().order() + " and the claimed ones"};
        return false;
      }
      covered *= it->size;
      over_text += (over_text.empty() ? "" : " x ") + o;
    }
    long long fixed = 1;
    MeshDim* open = nullptr;
    std::string sizes_text;
    for (auto& d : v.dims) {
      if (d.size != 0) sizes_text += (sizes_text.empty() ? "" : " ") + d.name + "=" + std::to_string(d.size);
      if (d.size == 0) {
        open = &d;
      } else {
        fixed *= d.size;
      }
    }
    const std::string value = sizes_text + " " + over_text + "=" + std::to_string(covered);
    if (fixed < 1 || covered % fixed != 0 || (!open && fixed != covered)) {
      std::string fixed_names;
      for (const auto& d : v.dims)
        if (d.size != 0) fixed_names += (fixed_names.empty() ? "" : " x ") + d.name;
      problem = {"distributed", value,
                 fixed_names + " (claimed by " + v.by + ") is carved out of " + over_text + " and must " +
                     (open ? "divide" : "equal") + " its size",
                 (open ? "a " + fixed_names + " size dividing " : "a " + fixed_names + " size of ") +
                     std::to_string(covered)};
      return false;
    }
    if (open) open->size = static_cast<int>(covered / fixed);
  }
  for (const auto& f : plan.flats) {
    for (const auto& d : f.dims) {
      bool known = std::any_of(dims.begin(), dims.end(), [&](const MeshDim& m) { return m.name == d; });
      for (const auto& v : views)
        for (const auto& vd : v.dims) known = known || vd.name == d;
      if (!known) {
        problem = {"features." + f.by, f.name, "the flat group joins '" + d + "', which is not a mesh dimension",
                   "dimensions of the mesh"};
        return false;
      }
    }
  }
  try {
    mesh = ProcessMesh(std::move(dims), std::move(views), plan.flats);
  } catch (const std::invalid_argument& e) {
    problem = {"distributed", plan.order.empty() ? "(mesh)" : plan.order, e.what(), "a consistent mesh plan"};
    return false;
  }
  plan.replicas = dp;
  return true;
}

}  // namespace hp::dist
