#include "hp/checkpoint/manifest.h"

#include <xxhash.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/detail/fs.h"
#include "checkpoint/error.h"
#include "checkpoint/safetensors.h"

namespace hp::ckpt {
namespace {

using detail::format_shape;
using nlohmann::json;

/// A JSON value quoted in an error message: never throws (a damaged string
/// may not be valid UTF-8), at most 80 characters.
std::string quote(const json& v) {
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 80) + "...";
  return text;
}

/// Validating accessors that name the file and the key path on failure.
class Parser {
 public:
  explicit Parser(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& problem) const {
    throw CheckpointError("bad manifest " + source_ + ": " + key + " " + problem + "; " +
                          kDamagedFix);
  }
  const json& field(const json& obj, const std::string& key, const std::string& path) const {
    if (!obj.is_object() || !obj.contains(key)) {
      fail(path + key, "is missing");
    }
    return obj.at(key);
  }
  std::int64_t integer(const json& obj, const std::string& key, const std::string& path) const {
    const auto& v = field(obj, key, path);
    if (!v.is_number_integer()) {
      fail(path + key, "is not an integer: " + quote(v));
    }
    return v.get<std::int64_t>();
  }
  std::string string(const json& obj, const std::string& key, const std::string& path) const {
    const auto& v = field(obj, key, path);
    if (!v.is_string()) {
      fail(path + key, "is not a string: " + quote(v));
    }
    return v.get<std::string>();
  }
  std::vector<std::int64_t> dims(const json& obj, const std::string& key,
                                 const std::string& path) const {
    const auto& v = field(obj, key, path);
    if (!v.is_array()) {
      fail(path + key, "is not an array of non-negative integers: " + quote(v));
    }
    std::vector<std::int64_t> out;
    for (const auto& d : v) {
      if (!d.is_number_integer() || d.get<std::int64_t>() < 0) {
        fail(path + key, "is not an array of non-negative integers: " + quote(v));
      }
      out.push_back(d.get<std::int64_t>());
    }
    return out;
  }

 private:
  std::string source_;
};

std::string describe(const ShardRecord& s) {
  return s.file + " offsets " + format_shape(s.offsets) + " lengths " + format_shape(s.lengths);
}

/// Product of `dims`, or -1 on overflow.
std::int64_t volume(const std::vector<std::int64_t>& dims) {
  std::int64_t v = 1;
  for (const auto d : dims) {
    if (__builtin_mul_overflow(v, d, &v)) {
      return -1;
    }
  }
  return v;
}

bool overlap(const ShardRecord& a, const ShardRecord& b) {
  for (std::size_t d = 0; d < a.offsets.size(); ++d) {
    const auto lo = std::max(a.offsets[d], b.offsets[d]);
    const auto hi = std::min(a.offsets[d] + a.lengths[d], b.offsets[d] + b.lengths[d]);
    if (hi <= lo) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string format_xxh64(std::uint64_t hash) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(hash));
  return buf;
}

std::string xxh64_hex(const std::string& bytes) {
  return format_xxh64(XXH64(bytes.data(), bytes.size(), 0));
}

namespace {

json dims_to_json(const std::vector<dist::MeshDim>& dims) {
  json out = json::array();
  for (const auto& d : dims) {
    out.push_back({{"name", d.name}, {"size", d.size}, {"role", dist::to_string(d.role)}, {"by", d.by}});
  }
  return out;
}

bool role_from_string(const std::string& text, dist::MeshRole& out) {
  for (auto r : {dist::MeshRole::kPartition, dist::MeshRole::kSplit, dist::MeshRole::kReplicate,
                 dist::MeshRole::kSequence}) {
    if (text == dist::to_string(r)) return out = r, true;
  }
  return false;
}

std::vector<std::string> strings_of(const json& j, const std::string& what, const std::string& source) {
  if (!j.is_array()) throw CheckpointError("bad manifest " + source + ": mesh " + what + " is not an array of names");
  std::vector<std::string> out;
  for (const auto& e : j) {
    if (!e.is_string()) throw CheckpointError("bad manifest " + source + ": mesh " + what + " is not an array of names");
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::vector<dist::MeshDim> dims_from_json(const json& j, const std::string& what, const std::string& source) {
  if (!j.is_array()) throw CheckpointError("bad manifest " + source + ": mesh " + what + " is not an array");
  std::vector<dist::MeshDim> out;
  for (const auto& e : j) {
    dist::MeshDim d;
    if (!e.is_object() || !e.contains("name") || !e.at("name").is_string() || !e.contains("size") ||
        !e.at("size").is_number_integer() || !e.contains("role") || !e.at("role").is_string() ||
        !role_from_string(e.at("role").get<std::string>(), d.role)) {
      throw CheckpointError("bad manifest " + source + ": mesh " + what + " holds " + e.dump() +
                            ", not {\"name\", \"size\", \"role\": partition, split, replicate or sequence}");
    }
    d.name = e.at("name").get<std::string>();
    d.size = e.at("size").get<int>();
    if (e.contains("by") && e.at("by").is_string()) d.by = e.at("by").get<std::string>();
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace

json mesh_to_json(const dist::ProcessMesh& mesh) {
  json views = json::array(), flats = json::array();
  for (const auto& v : mesh.views()) {
    views.push_back({{"name", v.name}, {"over", v.over}, {"dims", dims_to_json(v.dims)}, {"by", v.by}});
  }
  for (const auto& f : mesh.flats()) flats.push_back({{"name", f.name}, {"dims", f.dims}, {"by", f.by}});
  return {{"order", mesh.order()}, {"dims", dims_to_json(mesh.dims())}, {"views", views}, {"flats", flats}};
}

dist::ProcessMesh mesh_from_json(const json& j, const std::string& source) {
  if (!j.is_object() || !j.contains("dims")) {
    throw CheckpointError("bad manifest " + source + ": mesh is not an object with \"dims\"");
  }
  auto dims = dims_from_json(j.at("dims"), "dims", source);
  std::vector<dist::MeshView> views;
  std::vector<dist::MeshFlat> flats;
  for (const auto& v : j.value("views", json::array())) {
    if (!v.is_object() || !v.contains("name") || !v.at("name").is_string()) {
      throw CheckpointError("bad manifest " + source + ": a mesh view has no name");
    }
    views.push_back({v.at("name").get<std::string>(), strings_of(v.value("over", json()), "view over", source),
                     dims_from_json(v.value("dims", json()), "view dims", source), v.value("by", std::string())});
  }
  for (const auto& f : j.value("flats", json::array())) {
    if (!f.is_object() || !f.contains("name") || !f.at("name").is_string()) {
      throw CheckpointError("bad manifest " + source + ": a mesh flat group has no name");
    }
    flats.push_back({f.at("name").get<std::string>(), strings_of(f.value("dims", json()), "flat dims", source),
                     f.value("by", std::string())});
  }
  try {
    return dist::ProcessMesh(std::move(dims), std::move(views), std::move(flats));
  } catch (const std::invalid_argument& e) {
    throw CheckpointError("bad manifest " + source + ": its mesh is not valid: " + e.what());
  }
}

json manifest_to_json(const Manifest& m) {
  json tensors = json::object();
  for (const auto& [name, t] : m.tensors) {
    json shards = json::array();
    for (const auto& s : t.shards) {
      shards.push_back({{"file", s.file},
                        {"offsets", s.offsets},
                        {"lengths", s.lengths},
                        {"byte_range", json::array({s.byte_begin, s.byte_end})},
                        {"xxh64", s.xxh64}});
    }
    const auto dtype = safetensors_dtype_name(t.dtype);
    if (!dtype) {
      throw CheckpointInternalError("manifest tensor '" + name + "' has dtype " +
                                    std::string(c10::toString(t.dtype)) +
                                    ", which safetensors cannot store");
    }
    tensors[name] = {{"global_shape", t.global_shape}, {"dtype", *dtype}, {"shards", shards}};
    if (!t.placements.empty()) {
      json pl = json::array();
      for (const auto& p : t.placements) pl.push_back({{"dim", p.dim}, {"placement", p.placement.str()}});
      tensors[name]["placements"] = pl;
    }
  }
  json out = {{"format_version", m.format_version},
              {"step", m.step},
              {"layout", m.layout},
              {"config_hash", m.config_hash},
              {"tensors", tensors}};
  if (!m.state_xxh64.empty()) out["state_xxh64"] = m.state_xxh64;
  if (!m.config_file.empty()) out["config_file"] = m.config_file;
  if (!m.checksum_file.empty()) out["checksum_file"] = m.checksum_file;
  if (m.mesh) out["mesh"] = mesh_to_json(*m.mesh);
  return out;
}

Manifest manifest_from_json(const json& j, const std::string& source) {
  Parser p(source);
  if (!j.is_object()) {
    p.fail("the document", "is not a JSON object");
  }
  Manifest m;
  const auto version = p.integer(j, "format_version", "");
  if (version < Manifest::kOldestVersion || version > Manifest::kFormatVersion) {
    throw CheckpointError("unknown checkpoint format version " + std::to_string(version) + " in " +
                          source + "; this hyperparallel reads versions " +
                          std::to_string(Manifest::kOldestVersion) + " to " +
                          std::to_string(Manifest::kFormatVersion) +
                          (version > Manifest::kFormatVersion ? ": load it with the newer build that wrote it" : ""));
  }
  m.format_version = static_cast<int>(version);
  m.step = p.integer(j, "step", "");
  m.config_hash = p.string(j, "config_hash", "");
  if (j.contains("state_xxh64")) {
    m.state_xxh64 = p.string(j, "state_xxh64", "");
    if (m.state_xxh64.size() != 16 ||
        m.state_xxh64.find_first_not_of("0123456789abcdef") != std::string::npos) {
      p.fail("state_xxh64", "is not 16 lowercase hex digits");
    }
  }
  if (j.contains("config_file")) {
    m.config_file = p.string(j, "config_file", "");
    if (m.config_file != kConfigFileName) {
      p.fail("config_file", "is '" + m.config_file + "', not " + kConfigFileName);
    }
    if (m.config_hash.size() != 16 ||
        m.config_hash.find_first_not_of("0123456789abcdef") != std::string::npos) {
      p.fail("config_hash", "is not 16 lowercase hex digits (the xxh64 of " + m.config_file + ")");
    }
  }
  if (j.contains("checksum_file")) {
    m.checksum_file = p.string(j, "checksum_file", "");
    if (m.checksum_file != kManifestChecksumFile) {
      p.fail("checksum_file", "is '" + m.checksum_file + "', not " + kManifestChecksumFile);
    }
  }
  const auto& layout = p.field(j, "layout", "");
  if (!layout.is_object()) {
    p.fail("layout", "is not an object");
  }
  for (const auto& [axis, degree] : layout.items()) {
    m.layout[axis] = static_cast<int>(p.integer(layout, axis, "layout."));
  }
  if (version >= 2 && j.contains("mesh")) {
    m.mesh = std::make_shared<const dist::ProcessMesh>(mesh_from_json(j.at("mesh"), source));
  }
  const auto& tensors = p.field(j, "tensors", "");
  if (!tensors.is_object()) {
    p.fail("tensors", "is not an object");
  }
  for (const auto& [name, tj] : tensors.items()) {
    const std::string path = "tensors['" + name + "'].";
    TensorRecord t;
    t.global_shape = p.dims(tj, "global_shape", path);
    const auto dtype_name = p.string(tj, "dtype", path);
    const auto dtype = safetensors_dtype_from_name(dtype_name);
    if (!dtype) {
      p.fail(path + "dtype", "is unknown: '" + dtype_name + "' (hyperparallel reads " +
                                 supported_safetensors_dtypes() + ")");
    }
    t.dtype = *dtype;
    if (version == 1 && tj.contains("split")) {
      // Version 1: {"dim": d, "groups": [g1, g2, ...]}, each group a shard along d.
      const auto& split = tj.at("split");
      const auto dim = p.integer(split, "dim", path + "split.");
      const auto& groups = p.field(split, "groups", path + "split.");
      if (!groups.is_array()) {
        p.fail(path + "split.groups", "is not an array of group names: " + quote(groups));
      }
      if (dim < -1 || dim > 64) p.fail(path + "split", "is invalid: dim " + std::to_string(dim) + " is not a dimension");
      if ((dim == -1) != groups.empty()) {
        p.fail(path + "split", dim == -1 ? "is invalid: split dim -1 (whole) but split groups are given"
                                         : "is invalid: split dim " + std::to_string(dim) + " but no split groups");
      }
      for (const auto& g : groups) {
        if (!g.is_string()) {
          p.fail(path + "split.groups", "is not an array of group names: " + quote(groups));
        }
        t.placements.push_back({g.get<std::string>(), dist::Placement::shard(static_cast<int>(dim))});
      }
    }
    if (version >= 2 && tj.contains("placements")) {
      const auto& pl = tj.at("placements");
      if (!pl.is_array()) p.fail(path + "placements", "is not an array: " + quote(pl));
      for (const auto& e : pl) {
        dist::Placement placement;
        if (!e.is_object() || !e.contains("dim") || !e.at("dim").is_string() || !e.contains("placement") ||
            !e.at("placement").is_string() ||
            !dist::Placement::parse(e.at("placement").get<std::string>(), placement)) {
          p.fail(path + "placements", "holds " + quote(e) +
                                          ", not {\"dim\": <mesh dimension>, \"placement\": \"S(<d>)\" or \"R\"}");
        }
        t.placements.push_back({e.at("dim").get<std::string>(), placement});
      }
    }
    if (const auto problem = placement_problem(t.placements, t.global_shape.size()); !problem.empty()) {
      p.fail(path + (version == 1 ? "split" : "placements"), "is invalid: " + problem);
    }
    const auto& shards = p.field(tj, "shards", path);
    if (!shards.is_array() || shards.empty()) {
      p.fail(path + "shards", "is not a non-empty array");
    }
    for (std::size_t i = 0; i < shards.size(); ++i) {
      const std::string sp = path + "shards[" + std::to_string(i) + "].";
      const auto& sj = shards[i];
      ShardRecord s;
      s.file = p.string(sj, "file", sp);
      if (s.file.empty() || s.file.find('/') != std::string::npos || s.file == "." ||
          s.file == "..") {
        p.fail(sp + "file", "is not a plain file name: '" + s.file + "'");
      }
      s.offsets = p.dims(sj, "offsets", sp);
      s.lengths = p.dims(sj, "lengths", sp);
      if (s.offsets.size() != t.global_shape.size() || s.lengths.size() != t.global_shape.size()) {
        p.fail(sp + "offsets/lengths", "do not have one entry per dimension of global shape " +
                                           format_shape(t.global_shape));
      }
      for (std::size_t d = 0; d < t.global_shape.size(); ++d) {
        if (s.offsets[d] + s.lengths[d] > t.global_shape[d]) {
          p.fail(sp + "offsets/lengths",
                 "reach past global shape " + format_shape(t.global_shape) + ": " + describe(s));
        }
      }
      const auto& range = p.field(sj, "byte_range", sp);
      const auto non_negative = [](const json& v) {
        return v.is_number_integer() && v.get<std::int64_t>() >= 0;
      };
      if (!range.is_array() || range.size() != 2 || !non_negative(range[0]) ||
          !non_negative(range[1])) {
        p.fail(sp + "byte_range", "is not [begin, end]: " + quote(range));
      }
      s.byte_begin = range[0].get<std::uint64_t>();
      s.byte_end = range[1].get<std::uint64_t>();
      const auto count = volume(s.lengths);
      if (count < 0 || s.byte_end < s.byte_begin ||
          s.byte_end - s.byte_begin !=
              static_cast<std::uint64_t>(count) * c10::elementSize(t.dtype)) {
        p.fail(sp + "byte_range", "does not hold lengths " + format_shape(s.lengths) + " of " +
                                      dtype_name + ": " + quote(range));
      }
      s.xxh64 = p.string(sj, "xxh64", sp);
      if (s.xxh64.size() != 16 ||
          s.xxh64.find_first_not_of("0123456789abcdef") != std::string::npos) {
        p.fail(sp + "xxh64", "is not 16 lowercase hex digits: '" + s.xxh64 + "'");
      }
      t.shards.push_back(std::move(s));
    }
    m.tensors.emplace(name, std::move(t));
  }
  return m;
}

std::string manifest_checksum_path(const std::string& manifest_path) {
  return manifest_path + ".xxh64";
}

std::string manifest_checksum_text(const std::string& manifest_text) {
  return xxh64_hex(manifest_text) + "  manifest.json\n";
}

bool check_manifest_checksum(const std::string& manifest_path, const std::string& manifest_text) {
  const std::string sum_path = manifest_checksum_path(manifest_path);
  std::error_code ec;
  if (!std::filesystem::exists(sum_path, ec)) return false;
  const std::string sum = detail::read_text_file(sum_path);
  const std::string stored = sum.substr(0, 16);
  if (sum.size() != 16 + std::string("  manifest.json\n").size() ||
      stored.find_first_not_of("0123456789abcdef") != std::string::npos ||
      sum.compare(16, std::string::npos, "  manifest.json\n") != 0) {
    throw CheckpointError("bad manifest checksum file " + sum_path +
                          ": it must hold one line '<16 hex digits>  manifest.json'; it was "
                          "damaged or edited; " + kDamagedFix);
  }
  const std::string got = xxh64_hex(manifest_text);
  if (got != stored) {
    throw CheckpointError("bad manifest " + manifest_path + ": its xxh64 is " + got + " but " +
                          kManifestChecksumFile + " says " + stored +
                          ": the manifest (or its checksum) was damaged or edited; " + kDamagedFix);
  }
  return true;
}

Manifest load_manifest(const std::string& path) {
  const std::string text = detail::read_text_file(path);
  const bool checked = check_manifest_checksum(path, text);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    // The parser may quote what it read last: keep the message one short line.
    std::string why = e.what();
    if (why.size() > 160) why = why.substr(0, 160) + "...";
    for (auto& c : why) {
      if (c == '\n' || c == '\r') c = ' ';
    }
    throw CheckpointError("bad manifest " + path + ": not valid JSON (" + why + "); " +
                          kDamagedFix);
  }
  Manifest m;
  try {
    m = manifest_from_json(j, path);
  } catch (const json::exception& e) {
    throw CheckpointError("bad manifest " + path + ": unreadable (" + e.what() + "); " +
                          kDamagedFix);
  }
  if (!m.checksum_file.empty() && !checked) {
    throw CheckpointError("bad manifest " + path + ": it names its checksum file " +
                          manifest_checksum_path(path) + ", which is missing; " + kDamagedFix);
  }
  return m;
}

int TensorRecord::split_dim() const {
  for (const auto& p : placements) {
    if (p.placement.shards()) return p.placement.dim;
  }
  return -1;
}

std::string placement_problem(const dist::Placements& placements, std::size_t ndim) {
  for (std::size_t i = 0; i < placements.size(); ++i) {
    const auto& p = placements[i];
    if (p.dim.empty()) return "a mesh dimension name is empty";
    for (std::size_t j = 0; j < i; ++j) {
      if (placements[j].dim == p.dim) return "mesh dimension '" + p.dim + "' is placed twice";
    }
    if (p.placement.kind == dist::Placement::Kind::kHeadTail || p.placement.kind == dist::Placement::Kind::kPartial) {
      return p.dim + ":" + p.placement.str() + " is not a layout a checkpoint holds (only shards and replicas)";
    }
    if (p.placement.kind == dist::Placement::Kind::kShard &&
        (p.placement.dim < 0 || p.placement.dim >= static_cast<int>(ndim))) {
      return "split dim " + std::to_string(p.placement.dim) + " is outside [-1, " + std::to_string(ndim) +
             ") for a tensor of " + std::to_string(ndim) + " dimensions";
    }
  }
  return "";
}

std::string tiling_problem(const TensorRecord& t) {
  const auto total = volume(t.global_shape);
  if (total < 0) {
    return "global shape " + format_shape(t.global_shape) + " has too many elements";
  }
  if (t.shards.empty()) {
    return "no shard covers it";
  }
  std::int64_t covered = 0;
  for (std::size_t i = 0; i < t.shards.size(); ++i) {
    const auto& a = t.shards[i];
    if (a.offsets.size() != t.global_shape.size() || a.lengths.size() != t.global_shape.size()) {
      return "shard " + describe(a) + " does not have the rank of global shape " +
             format_shape(t.global_shape);
    }
    for (std::size_t d = 0; d < a.offsets.size(); ++d) {
      if (a.offsets[d] < 0 || a.lengths[d] < 0 || a.offsets[d] + a.lengths[d] > t.global_shape[d]) {
        return "shard " + describe(a) + " reaches outside global shape " +
               format_shape(t.global_shape);
      }
    }
    for (std::size_t k = 0; k < i; ++k) {
      if (overlap(t.shards[k], a)) {
        return "shards " + describe(t.shards[k]) + " and " + describe(a) + " overlap";
      }
    }
    covered += volume(a.lengths);
  }
  if (covered != total) {
    return "the shards cover " + std::to_string(covered) + " of its " + std::to_string(total) +
           " elements (global shape " + format_shape(t.global_shape) + "), leaving a gap";
  }
  return "";
}

}  // namespace hp::ckpt
