#include "backends/dist/mesh.h"

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

void MeshPlan::claim(const std::string& dim, int size, const std::string& feature) {
  auto it = claims.find(dim);
  if (it != claims.end()) {
    conflicts.push_back("mesh dimension '" + dim + "' is claimed by both '" + it->second.by +
                        "' and '" + feature + "'");
    return;
  }
  claims[dim] = Claim{size, feature};
}

int MeshPlan::size_of(const std::string& dim) const {
  auto it = claims.find(dim);
  return it == claims.end() ? 1 : it->second.size;
}

}  // namespace hp::dist
