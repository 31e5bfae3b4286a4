#pragma once
// Rank arithmetic for the process mesh, in one small value class: nobody else
// computes a rank. world = pp x dp x tp with tp fastest-varying, then dp, then
// pp (as Megatron). Expert parallel groups are carved out of the data-parallel
// ranks: ep divides dp, an ep group is ep consecutive dp indices, and the
// expert-data-parallel group (edp) joins the ranks holding the same experts.
#include <map>
#include <string>
#include <vector>

namespace hp::dist {

/// What a mesh dimension does to the model, declared by the feature that
/// claims it. Framework code works from roles and never names a dimension.
enum class MeshRole {
  kPartition,  ///< ranks hold different blocks (pp): loss, norms and parameter counts sum across it
  kSplit,      ///< ranks hold slices of the same tensors (tp, ep): a ShardSpec's split group
  kReplicate,  ///< ranks hold the same tensors and see different data (dp, and edp inside it)
};
const char* to_string(MeshRole role);

struct MeshCoord {
  int pp = 0, dp = 0, tp = 0, ep = 0, edp = 0;
};

class ProcessMesh {
 public:
  ProcessMesh() = default;
  /// Throws std::invalid_argument when a size is < 1 or ep does not divide dp.
  ProcessMesh(int pp, int dp, int tp, int ep = 1);

  static bool valid(int world, int pp, int dp, int tp, int ep = 1) noexcept {
    return pp >= 1 && dp >= 1 && tp >= 1 && ep >= 1 && dp % ep == 0 &&
           static_cast<long long>(pp) * dp * tp == world;
  }

  int world_size() const noexcept { return pp_ * dp_ * tp_; }
  int pp_size() const noexcept { return pp_; }
  int dp_size() const noexcept { return dp_; }
  int tp_size() const noexcept { return tp_; }
  int ep_size() const noexcept { return ep_; }
  int edp_size() const noexcept { return dp_ / ep_; }

  MeshCoord coord(int rank) const noexcept;
  int tp_rank(int rank) const noexcept { return rank % tp_; }
  int dp_rank(int rank) const noexcept { return (rank / tp_) % dp_; }
  int pp_rank(int rank) const noexcept { return rank / (tp_ * dp_); }
  int rank_of(int pp, int dp, int tp) const noexcept { return (pp * dp_ + dp) * tp_ + tp; }

  /// The names of the groups every rank belongs to: world, tp, dp, pp, ep, edp.
  static const std::vector<std::string>& group_names();
  /// Global ranks of the `dim` group that `rank` belongs to, in group order.
  std::vector<int> group_ranks(const std::string& dim, int rank) const;
  /// Every group of kind `dim`, each as its global ranks; a stable order that
  /// every rank computes the same way.
  std::vector<std::vector<int>> all_groups(const std::string& dim) const;

  /// The group of a role that has exactly one: partition -> the pipeline
  /// group, replicate -> the data-parallel group.
  static const std::string& role_group(MeshRole role);
  /// Every group of the split role (tensor and expert parallel), in a fixed order.
  static const std::vector<std::string>& split_groups();
  /// This rank's index along the replicate role, and its size (which slice
  /// of the global batch a rank reads).
  int replica_rank(int rank) const noexcept { return dp_rank(rank); }
  int replicas() const noexcept { return dp_; }
  /// One rank per partition (pipeline stage): the one at index 0 of every
  /// other dimension. They write what their partition holds.
  std::vector<int> leaders() const;
  bool is_leader(int rank) const noexcept { return dp_rank(rank) == 0 && tp_rank(rank) == 0; }
  /// Size of every dimension by name, for checkpoint manifests.
  std::map<std::string, int> sizes() const;
  /// The dimensions a layout is given by (the keys of sizes()).
  static const std::vector<std::string>& layout_dims();
  /// The mesh of a layout given as sizes by dimension (a missing one is 1).
  /// Throws std::invalid_argument naming an unknown dimension, a size below
  /// 1, or an expert-parallel size that does not divide the data-parallel one.
  static ProcessMesh from_sizes(const std::map<std::string, int>& sizes);
  /// Members of each `dim` group (any of group_names()); 0 for another name.
  int group_size(const std::string& dim) const;
  /// Position of `rank` in its `dim` group (its coordinate along `dim`).
  int group_index(const std::string& dim, int rank) const;

  /// "pp=1 dp=2 tp=2 ep=1"
  std::string shape() const;
  /// One line per rank: rank -> coordinates -> group members.
  std::string describe() const;
  /// "pp0 dp1 tp0" for log tags.
  std::string tag(int rank) const;

 private:
  int pp_ = 1, dp_ = 1, tp_ = 1, ep_ = 1;
};

/// What features claim while planning the mesh; the host turns it into a
/// ProcessMesh once every feature has had its say.
struct MeshPlan {
  struct Claim {
    int size = 1;
    std::string by;  ///< feature name
    MeshRole role = MeshRole::kSplit;
  };
  std::map<std::string, Claim> claims;  ///< "tp", "pp", "ep", ...
  /// Human-readable problems found by claim(): a dimension claimed twice, a
  /// dimension the mesh does not serve, or one claimed with another role.
  std::vector<std::string> conflicts;
  /// The replicate (data-parallel) size once the host resolved it; 0 before.
  int replicas = 0;

  /// Claims mesh dimension `dim` with `size` and `role` for `feature`.
  void claim(const std::string& dim, int size, const std::string& feature, MeshRole role);
  int size_of(const std::string& dim) const;
  /// The dimensions this mesh serves, each with the only role it can take:
  /// pp (partition), tp (split), ep (split, carved out of dp).
  static const std::map<std::string, MeshRole>& served();
};

/// Why a plan does not make a mesh: the config key to blame, its value, the
/// rule and the legal values (a config error).
struct MeshProblem {
  std::string key, value, rule, legal;
};

/// Turns a plan into a mesh for `world` ranks. `replicas` is the requested
/// data-parallel size (0: derive it). On failure returns false and fills
/// `problem`; on success sets `plan.replicas` and `mesh`.
bool resolve_mesh(MeshPlan& plan, int world, int replicas, ProcessMesh& mesh, MeshProblem& problem);

}  // namespace hp::dist
