#pragma once
// Writing a checkpoint from any number of ranks, committed atomically.
//
//   rank 0:      CheckpointWriter::prepare(root, step);   // drops a stale step_X.tmp
//   all ranks:   barrier
//                CheckpointWriter w(root, step, rank);
//                w.write_rank(model, optim);   // or write_file(...) calls, then finish_rank()
//   all ranks:   barrier
//   rank 0:      CheckpointWriter::commit(root, step, state, layout, config_yaml, keep);
//
// Until commit renames <root>/step_X.tmp to <root>/step_X and then replaces
// <root>/latest, a crash at any point leaves the previous checkpoint (and
// `latest`) untouched. The ranks must share the file system of `root`.
//
// Fault points (include/hp/fault/fault.h; HP_FAULT_INJECT=<point>, each kills
// the process with SIGKILL there):
//   checkpoint.after_files    in write_file, after the file's data is written
//   checkpoint.before_rename  in commit, after manifest.json (and its checksum
//                             file), state.json and config.yaml are written,
//                             before the rename
//   checkpoint.before_latest  in commit, after the rename, before `latest` is written
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "hp/checkpoint/file_names.h"
#include "hp/checkpoint/manifest.h"

namespace hp::ckpt {

/// A tensor as one rank holds it: `local` is the box of the global tensor
/// starting at `offsets` (one per dimension). A whole tensor has zero offsets
/// and `local.sizes() == global_shape`.
///
/// `placements` record how the run lays the tensor out (its ShardSpec),
/// whether or not this write stores a slice: empty for a whole tensor; e.g.
/// [tp:S(0), dp:S(0)] for a ZeRO slice of a tensor-parallel parameter. They
/// land in the manifest's "placements".
struct ShardedTensor {
  std::string name;
  at::Tensor local;
  std::vector<std::int64_t> global_shape;
  std::vector<std::int64_t> offsets;
  dist::Placements placements;
};

/// Writes one rank's part of step `step` under `root_dir`.
class CheckpointWriter {
 public:
  /// Creates <root>/step_%08d.tmp if needed (every rank may do so).
  CheckpointWriter(std::string root_dir, std::int64_t step, int rank);

  /// Rank 0, before the barrier that precedes every rank's constructor:
  /// creates `root` if needed and removes a stale step_X.tmp left by a crash.
  static void prepare(const std::string& root, std::int64_t step);

  /// Writes `tensors` to the safetensors file `file_name` (a plain name,
  /// unique across all ranks, e.g. "model-rank00003.safetensors") in the
  /// staging directory and records their shards. A tensor name may appear in
  /// several files of a rank, but only once per file.
  void write_file(const std::string& file_name, const std::vector<ShardedTensor>& tensors);

  /// Writes shards-rank%05d.json, this rank's part of the manifest, with
  /// fsync. Every rank calls it once, even one that wrote no file.
  void finish_rank();

  /// This rank's whole part, as every checkpoint IO writes it: `model` into
  /// model_file_name(rank) and `optim` into optim_file_name(rank)
  /// (file_names.h; an empty list writes no file), then finish_rank().
  void write_rank(const std::vector<ShardedTensor>& model, const std::vector<ShardedTensor>& optim);
  /// The file write_rank() is writing, or wrote last ("(none)" before it
  /// starts): what an error message names when it throws.
  const std::string& current_file() const { return current_file_; }

  /// Rank 0, after every rank's finish_rank (a barrier): merges the ranks'
  /// parts into manifest.json (its xxh64 in manifest.json.xxh64), checking that every tensor's shards tile its
  /// global shape exactly and that the parts agree on its global shape, dtype
  /// and split (else CheckpointInternalError naming the tensor),
  /// writes state.json and, when `config_text` is not empty, config.yaml (the
  /// resolved config the run was started with; the manifest lists it and its
  /// xxh64 is the manifest's config_hash), renames step_X.tmp to step_X (atomically exchanging
  /// it with an existing step_X) and then points `latest` at it. Everything is
  /// fsynced, files and directories. `keep` > 0 then deletes all but the
  /// newest `keep` step directories (never the one just committed).
  /// `writers`: the ranks whose parts must be there (each a missing part is
  /// refused by name, an unexpected one too); empty: ranks 0..highest found.
  static void commit(const std::string& root, std::int64_t step, const nlohmann::json& state,
                     const Layout& layout, const std::string& config_text, int keep = 0,
                     const std::vector<int>& writers = {});
  /// Same, recording the run's whole mesh in the manifest (its sizes as the
  /// layout): what a run and hp-ckpt convert write.
  static void commit_with_mesh(const std::string& root, std::int64_t step, const nlohmann::json& state,
                               const dist::ProcessMesh& mesh, const std::string& config_text, int keep = 0,
                               const std::vector<int>& writers = {});

  /// "step_00000100" (ckpt::step_dir_name, file_names.h).
  static std::string step_dir_name(std::int64_t step);

  const std::string& staging_dir() const { return staging_; }
  std::int64_t step() const { return step_; }
  int rank() const { return rank_; }

 private:
  static void commit_impl(const std::string& root, std::int64_t step, const nlohmann::json& state,
                          const Layout& layout, const dist::ProcessMesh* mesh, const std::string& config_text,
                          int keep, const std::vector<int>& writers);

  std::string root_;
  std::int64_t step_;
  int rank_;
  std::string staging_;
  std::map<std::string, TensorRecord> shards_;
  std::vector<std::string> files_;
  bool finished_ = false;
  std::string current_file_ = "(none)";
};

}  // namespace hp::ckpt
