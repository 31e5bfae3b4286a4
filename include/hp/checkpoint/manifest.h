#pragma once
// The manifest of a committed checkpoint (manifest.json): what each tensor is
// and which byte ranges of which files hold which parts of it. Its JSON:
//
//   {"format_version": 2, "step": 100, "config_hash": "<xxh64 of config.yaml>",
//    "config_file": "config.yaml", "state_xxh64": "<xxh64 of state.json>",
//    "checksum_file": "manifest.json.xxh64",
//    "layout": {"pp": 2, "dp": 1, "tp": 2, "ep": 1},
//    "tensors": {"<name>": {"global_shape": [8, 4], "dtype": "F32",
//       "shards": [{"file": "model-rank00000.safetensors",
//                   "offsets": [0, 0], "lengths": [4, 4],
//                   "byte_range": [123, 187], "xxh64": "0123456789abcdef"}],
//       "placements": [{"dim": "tp", "placement": "S(0)"}]}}}
//
// "placements" says how the run that wrote the checkpoint laid the tensor
// over its mesh, outermost first (absent: unknown, or whole; a placement as
// dist::Placement::str() spells it). Version 1 wrote "split": {"dim": 0,
// "groups": ["tp"]} instead, still read. The shards need not follow either:
// a gathered writer stores a split tensor whole.
// dtype names are those of safetensors; file names are relative to the step
// directory; byte ranges are absolute within the file.
//
// The manifest's own integrity: the xxh64 of its raw bytes is stored outside
// it, in manifest.json.xxh64 beside it ("<16 hex digits>  manifest.json\n",
// the line `xxh64sum` writes, so `xxh64sum -c manifest.json.xxh64` checks it
// too), written before the step directory is committed. load_manifest checks
// it before parsing, so any damaged byte is refused in one line naming the
// file. "checksum_file" says the manifest has one, so a lost checksum file is
// refused too; a manifest without the key (written before checksums) loads
// unchecked, as before. The checksum changed no format version: older builds
// ignore the key and the extra file.
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "hp/comm/mesh.h"
#include "hp/comm/placement.h"

namespace hp::ckpt {

/// Parallel degrees the checkpoint was written under, e.g. {"pp": 2, "tp": 2}.
/// Informational: any layout can read any checkpoint.
using Layout = std::map<std::string, int>;

/// One box of a tensor stored contiguously in one file.
struct ShardRecord {
  std::string file;
  std::vector<std::int64_t> offsets;
  std::vector<std::int64_t> lengths;
  std::uint64_t byte_begin = 0;
  std::uint64_t byte_end = 0;
  /// XXH64 (seed 0) of the bytes, 16 lowercase hex digits.
  std::string xxh64;
};

struct TensorRecord {
  std::vector<std::int64_t> global_shape;
  at::ScalarType dtype = at::kFloat;
  std::vector<ShardRecord> shards;
  /// How the run laid it out over its mesh, outermost first (empty: whole,
  /// or the writer did not say): [tp:S(0)], [ep:S(0)], [tp:S(0), dp:S(0)]
  /// for a ZeRO slice of a tensor-parallel parameter. Read from "split" in
  /// a version-1 manifest (each group a shard along its dim).
  dist::Placements placements;
  /// The one tensor dimension its shards cut, -1 when whole.
  int split_dim() const;
  /// The mesh dimensions that shard it, outermost first.
  std::vector<std::string> split_groups() const { return dist::shard_dims(placements); }
};

struct Manifest {
  /// The format this build writes; it reads it and every older one
  /// (kOldestVersion..kFormatVersion). 2: placements per tensor in place of
  /// version 1's "split" {dim, groups}.
  static constexpr int kFormatVersion = 2;
  static constexpr int kOldestVersion = 1;

  int format_version = kFormatVersion;
  std::int64_t step = 0;
  Layout layout;
  /// xxh64 (16 hex digits) of `config_file`, the resolved config the run was
  /// started with. Older manifests hold another hash here and no config_file:
  /// their config cannot be compared.
  std::string config_hash;
  /// "config.yaml" when the step directory holds the resolved config, else "".
  std::string config_file;
  /// xxh64 of state.json (step, RNG, data position, counters), so the run
  /// state is protected like the tensors; "" in manifests written before it.
  std::string state_xxh64;
  /// kManifestChecksumFile when the step directory holds the manifest's
  /// checksum, "" in manifests written before it (and in the ranks' parts).
  std::string checksum_file;
  std::map<std::string, TensorRecord> tensors;
  /// The mesh the run had: its dimensions with sizes, roles and owners, the
  /// order, views and flat groups ("mesh" in the JSON), so tools re-shard
  /// over any dimension a feature registers. Null in a version-1 manifest
  /// and from a writer that did not give it.
  std::shared_ptr<const dist::ProcessMesh> mesh;
};

/// {"order": "tp-dp-pp", "dims": [{"name", "size", "role", "by"}, ...]
///  (innermost first), "views": [{"name", "over", "dims", "by"}],
///  "flats": [{"name", "dims", "by"}]}.
nlohmann::json mesh_to_json(const dist::ProcessMesh& mesh);
/// The inverse; CheckpointError naming `source` and the problem.
dist::ProcessMesh mesh_from_json(const nlohmann::json& json, const std::string& source);

nlohmann::json manifest_to_json(const Manifest& manifest);
/// Parses and validates (shard boxes inside the global shape, byte ranges
/// that hold exactly their box). `source` names the file in error messages.
/// Another format_version is refused with a CheckpointError.
Manifest manifest_from_json(const nlohmann::json& json, const std::string& source);
/// Reads a manifest file, checks its bytes against its checksum file (when
/// there, or when the manifest says it has one) and parses it. Every problem
/// is a CheckpointError of one line naming the file, ending in the fix.
Manifest load_manifest(const std::string& path);

/// The checksum file of the manifest at `manifest_path`: the same path with
/// ".xxh64" appended.
std::string manifest_checksum_path(const std::string& manifest_path);
/// The contents of the checksum file for manifest bytes `manifest_text`:
/// "<xxh64>  manifest.json\n".
std::string manifest_checksum_text(const std::string& manifest_text);
/// Throws CheckpointError (one line, naming both files and the fix) unless
/// `manifest_text`, read from `manifest_path`, matches its checksum file.
/// Returns false, having checked nothing, when there is no checksum file.
bool check_manifest_checksum(const std::string& manifest_path, const std::string& manifest_text);

/// Why the shards of `tensor` do not tile its global shape exactly (a gap or
/// an overlap), or "" when they do.
std::string tiling_problem(const TensorRecord& tensor);

/// Why the placements of a tensor of `ndim` dimensions are not valid (a
/// shard outside [0, ndim), an empty or repeated mesh dimension, a placement
/// a checkpoint cannot hold: head-tail or partial), or "" when they are.
std::string placement_problem(const dist::Placements& placements, std::size_t ndim);

/// 16 lowercase hex digits.
std::string format_xxh64(std::uint64_t hash);
/// format_xxh64 of XXH64(bytes, seed 0).
std::string xxh64_hex(const std::string& bytes);

/// The name of the resolved config in a step directory.
constexpr const char* kConfigFileName = "config.yaml";
/// The name of the manifest's checksum file in a step directory.
constexpr const char* kManifestChecksumFile = "manifest.json.xxh64";
/// What to do about a damaged step directory, the end of every such error.
constexpr const char* kDamagedFix = "resume from another step";

}  // namespace hp::ckpt
