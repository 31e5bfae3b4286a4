#include "backends/dist/mesh.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace hp::dist {

ProcessMesh::ProcessMesh(int pp, int dp, int tp, int ep) : pp_(pp), dp_(dp), tp_(tp), ep_(ep) {
  if (pp < 1 || dp < 1 || tp < 1 || ep < 1) {
    throw std::invalid_argument("process mesh sizes must be >= 1 (got pp=" + std::to_string(pp) +
                                " dp=" + std::to_string(dp) + " tp=" + std::to_string(tp) +
                                " ep=" + std::to_string(ep) + ")");
  }
  if (dp % ep != 0) {
    throw std::invalid_argument("expert parallel size " + std::to_string(ep) +
                                " must divide the data-parallel size " + std::to_string(dp));
  }
}

MeshCoord ProcessMesh::coord(int rank) const noexcept {
  MeshCoord c;
  c.tp = tp_rank(rank);
  c.dp = dp_rank(rank);
  c.pp = pp_rank(rank);
  c.ep = c.dp % ep_;
  c.edp = c.dp / ep_;
  return c;
}

const std::vector<std::string>& ProcessMesh::group_names() {
  static const std::vector<std::string> kNames = {"world", "tp", "dp", "pp", "ep", "edp"};
  return kNames;
}

std::vector<int> ProcessMesh::group_ranks(const std::string& dim, int rank) const {
  const MeshCoord c = coord(rank);
  std::vector<int> out;
  if (dim == "world") {
    for (int r = 0; r < world_size(); ++r) out.push_back(r);
  } else if (dim == "tp") {
    for (int t = 0; t < tp_; ++t) out.push_back(rank_of(c.pp, c.dp, t));
  } else if (dim == "dp") {
    for (int d = 0; d < dp_; ++d) out.push_back(rank_of(c.pp, d, c.tp));
  } else if (dim == "pp") {
    for (int p = 0; p < pp_; ++p) out.push_back(rank_of(p, c.dp, c.tp));
  } else if (dim == "ep") {
    const int first = c.edp * ep_;
    for (int e = 0; e < ep_; ++e) out.push_back(rank_of(c.pp, first + e, c.tp));
  } else if (dim == "edp") {
    for (int g = 0; g < dp_ / ep_; ++g) out.push_back(rank_of(c.pp, g * ep_ + c.ep, c.tp));
  } else {
    throw std::invalid_argument("internal error: unknown mesh group '" + dim + "', please report");
  }
  return out;
}

std::vector<std::vector<int>> ProcessMesh::all_groups(const std::string& dim) const {
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < world_size(); ++r) {
    auto g = group_ranks(dim, r);
    bool seen = false;
    for (const auto& h : groups) seen |= (h == g);
    if (!seen) groups.push_back(std::move(g));
  }
  return groups;
}

std::string ProcessMesh::shape() const {
  return "pp=" + std::to_string(pp_) + " dp=" + std::to_string(dp_) + " tp=" + std::to_string(tp_) +
         " ep=" + std::to_string(ep_);
}

std::string ProcessMesh::tag(int rank) const {
  auto c = coord(rank);
  return "pp" + std::to_string(c.pp) + " dp" + std::to_string(c.dp) + " tp" + std::to_string(c.tp);
}

std::string ProcessMesh::describe() const {
  std::ostringstream os;
  os << "mesh " << shape() << " (world " << world_size() << ")\n";
  for (int r = 0; r < world_size(); ++r) {
    auto c = coord(r);
    os << "  rank " << r << " -> pp " << c.pp << ", dp " << c.dp << ", tp " << c.tp << ", ep "
       << c.ep << ", edp " << c.edp << " ->";
    for (const auto& g : group_names()) {
      if (g == "world") continue;
      os << " " << g << "[";
      auto m = group_ranks(g, r);
      for (std::size_t i = 0; i < m.size(); ++i) os << (i ? "," : "") << m[i];
      os << "]";
    }
    os << "\n";
  }
  return os.str();
}

const char* to_string(MeshRole role) {
  switch (role) {
    case MeshRole::kPartition: return "partition";
    case MeshRole::kSplit: return "split";
    case MeshRole::kReplicate: return "replicate";
  }
  return "?";
}

const std::string& ProcessMesh::role_group(MeshRole role) {
  static const std::string kPartition = "pp", kReplicate = "dp";
  if (role == MeshRole::kPartition) return kPartition;
  if (role == MeshRole::kReplicate) return kReplicate;
  throw std::invalid_argument("internal error: the split role has several groups (see split_groups), please report");
}

const std::vector<std::string>& ProcessMesh::split_groups() {
  static const std::vector<std::string> kSplit = {"tp", "ep"};
  return kSplit;
}

std::vector<int> ProcessMesh::leaders() const {
  std::vector<int> out;
  for (int p = 0; p < pp_; ++p) out.push_back(rank_of(p, 0, 0));
  return out;
}

std::map<std::string, int> ProcessMesh::sizes() const {
  return {{"pp", pp_}, {"dp", dp_}, {"tp", tp_}, {"ep", ep_}};
}

const std::vector<std::string>& ProcessMesh::layout_dims() {
  static const std::vector<std::string> kDims = {"tp", "dp", "ep", "pp"};
  return kDims;
}

ProcessMesh ProcessMesh::from_sizes(const std::map<std::string, int>& sizes) {
  std::map<std::string, int> full{{"pp", 1}, {"dp", 1}, {"tp", 1}, {"ep", 1}};
  for (const auto& [dim, n] : sizes) {
    if (full.count(dim) == 0) {
      throw std::invalid_argument("unknown mesh dimension '" + dim + "' (a layout is given by tp, dp, ep and pp)");
    }
    full[dim] = n;
  }
  for (const auto& [dim, n] : full) {
    if (n < 1) throw std::invalid_argument(dim + " size " + std::to_string(n) + " is below 1: every size is at least 1");
  }
  if (full["dp"] % full["ep"] != 0) {
    throw std::invalid_argument("ep " + std::to_string(full["ep"]) + " does not divide dp " +
                                std::to_string(full["dp"]) +
                                ": expert parallel is carved out of data parallel, so ep must divide dp");
  }
  return ProcessMesh(full["pp"], full["dp"], full["tp"], full["ep"]);
}

int ProcessMesh::group_size(const std::string& dim) const {
  const auto& names = group_names();
  if (std::find(names.begin(), names.end(), dim) == names.end()) return 0;
  return static_cast<int>(group_ranks(dim, 0).size());
}

int ProcessMesh::group_index(const std::string& dim, int rank) const {
  const auto members = group_ranks(dim, rank);
  return static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
}

const std::map<std::string, MeshRole>& MeshPlan::served() {
  static const std::map<std::string, MeshRole> kServed = {
      {"pp", MeshRole::kPartition}, {"tp", MeshRole::kSplit}, {"ep", MeshRole::kSplit}};
  return kServed;
}

void MeshPlan::claim(const std::string& dim, int size, const std::string& feature, MeshRole role) {
  auto s = served().find(dim);
  if (s == served().end()) {
    std::string legal;
    for (const auto& [d, r] : served()) legal += (legal.empty() ? "" : ", ") + d + " (" + to_string(r) + ")";
    conflicts.push_back("mesh dimension '" + dim + "' claimed by '" + feature +
                        "' is not served by the process mesh, so nothing would act on it (served: " + legal + ")");
    return;
  }
  if (s->second != role) {
    conflicts.push_back("mesh dimension '" + dim + "' claimed by '" + feature + "' with role " + to_string(role) +
                        ", but the mesh serves it only as " + to_string(s->second));
    return;
  }
  auto it = claims.find(dim);
  if (it != claims.end()) {
    conflicts.push_back("mesh dimension '" + dim + "' is claimed by both '" + it->second.by +
                        "' and '" + feature + "'");
    return;
  }
  claims[dim] = Claim{size, feature, role};
}

bool resolve_mesh(MeshPlan& plan, int world, int dp, ProcessMesh& mesh, MeshProblem& problem) {
  const int tp = plan.size_of("tp"), pp = plan.size_of("pp"), ep = plan.size_of("ep");
  auto by = [&](const std::string& dim) {
    auto it = plan.claims.find(dim);
    return it == plan.claims.end() ? std::string("(none)") : it->second.by;
  };
  const std::string shape = "pp=" + std::to_string(pp) + " (" + by("pp") + "), tp=" + std::to_string(tp) + " (" +
                            by("tp") + ")";
  if (dp == 0) {
    if (world % (pp * tp) != 0) {
      problem = {"distributed", "world size " + std::to_string(world),
                 "world size must equal pipeline x data x tensor parallel sizes, but " + std::to_string(world) +
                     " is not a multiple of pp x tp = " + std::to_string(pp * tp) + " [" + shape + "]",
                 "a world size that is a multiple of " + std::to_string(pp * tp) + ", or other pipeline/tensor sizes"};
      return false;
    }
    dp = world / (pp * tp);
  } else if (static_cast<long long>(pp) * dp * tp != world) {
    problem = {"distributed.data_parallel_size", std::to_string(dp),
               "world size " + std::to_string(world) + " != pp x dp x tp = " + std::to_string(pp) + " x " +
                   std::to_string(dp) + " x " + std::to_string(tp) + " [" + shape + "]",
               world % (pp * tp) == 0 ? std::to_string(world / (pp * tp)) + " or 0 (derive)"
                                      : "0 (derive), after fixing pp x tp to divide " + std::to_string(world)};
    return false;
  }
  if (dp % ep != 0) {
    problem = {"distributed", "ep=" + std::to_string(ep) + " dp=" + std::to_string(dp),
               "the expert-parallel size must divide the data-parallel size (claimed by " + by("ep") + ")",
               "an expert-parallel size dividing " + std::to_string(dp)};
    return false;
  }
  plan.replicas = dp;
  mesh = ProcessMesh(pp, dp, tp, ep);
  return true;
}

int MeshPlan::size_of(const std::string& dim) const {
  auto it = claims.find(dim);
  return it == claims.end() ? 1 : it->second.size;
}

}  // namespace hp::dist
