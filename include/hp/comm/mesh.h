#pragma once
// The process mesh: an n-dimensional named grid of ranks, in one small value
// class (nobody else computes a rank). Features claim its dimensions (name,
// size, role) while the mesh is planned; the one dimension the mesh owns is
// the data-parallel remainder (data_dim()), whose size is what the world
// leaves. The rank layout follows one order string, innermost (fastest-
// varying) dimension first, as Megatron's "tp-cp-ep-dp-pp".
//
// A view is another factoring of some of the same ranks: the dimensions it
// covers ("over") are flattened in mesh order and cut again into its own
// named dimensions, innermost first (Megatron's "parallel folding": experts
// see etp x ep x edp where attention sees tp x cp x dp). Expert parallel's
// carve-out of dp is a view over dp with dims [ep, edp], the mesh naming the
// remainder (carve_remainder). A flat group joins
// several dimensions of one coordinate system into one group (a ZeRO shard
// over dp x cp). Every group of every view and flat is created once, at the
// context's creation, in one fixed order on every rank.
//
// Framework code works from roles and never names a dimension.
#include <map>
#include <set>
#include <string>
#include <vector>

namespace hp::dist {

/// What a mesh dimension does to the model, declared by the feature that
/// claims it.
enum class MeshRole {
  kPartition,  ///< ranks hold different blocks (pp): loss, norms and parameter counts sum across it
  kSplit,      ///< ranks hold slices of the same tensors (tp, ep)
  kReplicate,  ///< ranks hold the same tensors and read different samples (dp, edp)
  kSequence,   ///< ranks hold the same tensors and read different positions of the same samples (cp):
               ///< gradients are summed over it as over replicate, the batch is not split over it
};
const char* to_string(MeshRole role);

struct MeshDim {
  std::string name;
  int size = 1;  ///< 0 in a plan: "what the covered ranks leave" (one per view)
  MeshRole role = MeshRole::kSplit;
  std::string by;  ///< the feature that claimed it ("" for the mesh's own)
};

/// Another factoring of the ranks of some base dimensions.
struct MeshView {
  std::string name;               ///< e.g. "experts"
  std::vector<std::string> over;  ///< base dimensions it refactors (any order; used in mesh order)
  std::vector<MeshDim> dims;      ///< its own dimensions, innermost first
  std::string by;
  /// In a plan: the view also covers every sequence dimension claimed
  /// (resolve_mesh adds them to `over`), as expert parallel folds over the
  /// ranks that attention sees as cp x dp.
  bool with_sequence = false;
};

/// Several dimensions of one coordinate system (all base, or all of one
/// view) joined into one group, members in ascending rank.
struct MeshFlat {
  std::string name;
  std::vector<std::string> dims;
  std::string by;
};

class ProcessMesh {
 public:
  /// One rank: only the data dimension, of size 1.
  ProcessMesh();
  /// `dims` innermost first; views and flats must be consistent (sizes
  /// resolved, covered dimensions known): throws std::invalid_argument
  /// naming the problem otherwise. Names are unique across all of them.
  explicit ProcessMesh(std::vector<MeshDim> dims, std::vector<MeshView> views = {},
                       std::vector<MeshFlat> flats = {});

  /// The name of the dimension the mesh owns: the data-parallel remainder.
  static const std::string& data_dim();
  /// The name the mesh gives what a carve of `dim` leaves of the data ranks
  /// (replicate): `dim` without a trailing 'p', then data_dim() ("ep" ->
  /// "edp", Megatron's expert data parallel). A feature never spells it.
  static std::string carve_remainder(const std::string& dim);

  int world_size() const noexcept { return world_; }
  const std::vector<MeshDim>& dims() const noexcept { return dims_; }
  const std::vector<MeshView>& views() const noexcept { return views_; }
  const std::vector<MeshFlat>& flats() const noexcept { return flats_; }
  /// "tp-dp-pp": base dimensions, innermost first.
  std::string order() const;

  /// Whether `name` is a group of this mesh ("world", a base or view
  /// dimension, a flat).
  bool has(const std::string& name) const;
  /// The base or view dimension called `name`; null for anything else.
  const MeshDim* find(const std::string& name) const;
  /// Every group kind: "world", base dimensions (mesh order), view
  /// dimensions (declaration order), flats. The order groups are created in.
  std::vector<std::string> group_names() const;
  /// Members of each `name` group; 0 for a name the mesh does not have.
  int group_size(const std::string& name) const;
  /// Position of `rank` in its `name` group.
  int group_index(const std::string& name, int rank) const;
  /// Global ranks of the `name` group that `rank` belongs to, ascending.
  std::vector<int> group_ranks(const std::string& name, int rank) const;
  /// Every group of kind `name`, each as its global ranks; the same order on
  /// every rank (by the lowest member).
  std::vector<std::vector<int>> all_groups(const std::string& name) const;

  /// The group that runs one collective over all of `dims` at once: the
  /// one of them larger than 1, or a flat group joining exactly those
  /// larger than 1; "" when all have size 1 or no group joins them (the
  /// caller then runs one collective per dimension). The mesh joins the
  /// replicate dimensions, and the replicate with the sequence ones, of the
  /// base and of each view, whenever two or more are larger than 1.
  std::string flat_over(const std::vector<std::string>& dims) const;
  /// Base and view dimensions with `role`, base first, in mesh order.
  std::vector<std::string> dims_with(MeshRole role) const;
  /// The partition dimension, or "" when there is none (one stage).
  std::string partition_dim() const;
  /// The dimensions a replicated parameter's gradient is summed over: the
  /// base dimensions with the replicate or sequence role, in mesh order.
  std::vector<std::string> data_dims() const;
  /// The base dimensions with the replicate role, in mesh order (the
  /// samples are split over them).
  std::vector<std::string> replicate_dims() const;
  /// The dimensions the gradient of a parameter sharded over `shard_dims`
  /// is summed over: data_dims(), where a view one of `shard_dims` belongs
  /// to replaces the base dimensions it covers by its own replicate and
  /// sequence dimensions (experts sharded over ep sum over edp, not dp).
  std::vector<std::string> grad_sync_dims(const std::vector<std::string>& shard_dims) const;
  /// The dimensions that split tensors (base and view), in mesh order.
  std::vector<std::string> split_groups() const { return dims_with(MeshRole::kSplit); }
  /// Samples are split over the base replicate dimensions: this rank's index
  /// along them (flattened, innermost first) and their product.
  int replica_rank(int rank) const;
  int replicas() const;
  /// One rank per partition (pipeline stage): the one at index 0 of every
  /// other base dimension. They write what their partition holds.
  std::vector<int> leaders() const;
  bool is_leader(int rank) const;
  /// Size of every base and view dimension by name (checkpoint layouts).
  std::map<std::string, int> sizes() const;

  /// "pp=1 dp=2 tp=2 ep=1 edp=2": base dimensions outermost first, then views.
  std::string shape() const;
  /// One line for the layout, one per dimension, view and flat group, one
  /// per group kind (how many groups of which size, the first and the last
  /// rank's), then one per rank (coordinates -> group members) when `all_ranks`
  /// or the world has at most kRankLines ranks. O(world x group kinds).
  std::string describe(bool all_ranks = false) const;
  /// Worlds up to this size list every rank in describe() by default.
  static constexpr int kRankLines = 64;
  /// "pp0 dp1 tp0" for log tags (base dimensions, outermost first).
  std::string tag(int rank) const;

 private:
  struct Where {
    int view = -1;  ///< -1: base
    std::vector<int> dims;  ///< indices into dims_ or views_[view].dims
  };
  bool locate(const std::string& name, Where& where) const;
  std::vector<int> base_coords(int rank) const;
  int rank_of(const std::vector<int>& base) const;
  /// Coordinates of `rank` in view `v`: base dims outside it, then its own.
  std::vector<int> view_coords(int v, const std::vector<int>& base) const;
  std::vector<int> sizes_of(const Where& w) const;

  std::vector<MeshDim> dims_;
  std::vector<MeshView> views_;
  std::vector<MeshFlat> flats_;
  void add_role_flats(std::set<std::string>& names);
  int world_ = 1;
};

/// What features claim while planning the mesh; resolve_mesh turns it into a
/// ProcessMesh once every feature has had its say.
/// The dimension names of a mesh order string, innermost first:
/// "tp-dp-pp" -> {"tp", "dp", "pp"}; "" -> {}.
std::vector<std::string> order_dims(const std::string& order);

struct MeshPlan {
  struct Claim {
    int size = 1;
    std::string by;  ///< feature name
    MeshRole role = MeshRole::kSplit;
  };
  std::map<std::string, Claim> claims;  ///< base dimensions
  std::vector<MeshView> views;
  std::vector<MeshFlat> flats;
  /// The rank layout, innermost first ("tp-dp-pp"); "" orders by role: split,
  /// sequence, replicate, partition (names ascending within a role).
  std::string order;
  /// Human-readable problems found while claiming: a name claimed twice, a
  /// second partition dimension, a reserved name.
  std::vector<std::string> conflicts;
  /// The data-parallel size once resolved; 0 before.
  int replicas = 0;

  /// Claims base dimension `dim` with `size` and `role` for `feature`.
  void claim(const std::string& dim, int size, const std::string& feature, MeshRole role);
  /// Carves `dim` (`size`, innermost) out of the data dimension and every
  /// sequence dimension (the ranks holding the same parameters), the rest
  /// becoming the replicate dimension carve_remainder(dim), named by the
  /// mesh: a view named after `feature`.
  void carve(const std::string& dim, int size, const std::string& feature, MeshRole role);
  /// Declares another factoring of the ranks of `view.over` (one of its
  /// dimensions may have size 0: what the others leave).
  void view(MeshView view);
  /// Joins `dims` (all base, or all of one view) into one group `name`.
  void flatten(const std::string& name, std::vector<std::string> dims, const std::string& feature);
  /// Size of a claimed base or view dimension; 1 for one nobody claimed
  /// (0 for a view's remainder before resolution).
  int size_of(const std::string& dim) const;

 private:
  bool name_taken(const std::string& name, const std::string& feature);
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
