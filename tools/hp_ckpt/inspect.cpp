// hp-ckpt inspect: what a checkpoint holds, from its manifest alone.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <fstream>
#include <set>
#include <sstream>

#include "checkpoint/detail/fs.h"
#include "hp/checkpoint/file_names.h"
#include "hp/checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "framework/trainer/resume_check.h"
#include "tools/hp_ckpt/hp_ckpt.h"

namespace hp::ckpt_tool {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string split_text(const ckpt::TensorRecord& t) {
  return t.placements.empty() ? "-" : dist::describe(t.placements);
}

std::string dtype_text(const ckpt::TensorRecord& t) {
  const auto name = ckpt::safetensors_dtype_name(t.dtype);
  return name ? *name : std::string(c10::toString(t.dtype));
}

}  // namespace

int run_inspect(const std::string& dir, bool as_json) {
  const std::string step_dir = resolve_step_dir(dir);
  const ckpt::Manifest m = ckpt::load_manifest((fs::path(step_dir) / ckpt::kManifestFileName).string());

  std::set<std::string> files;
  std::uint64_t total_bytes = 0;
  std::size_t shards = 0, optimizer = 0;
  json tensors = json::array();
  for (const auto& [name, t] : m.tensors) {
    const bool optim = is_optimizer_state(t);
    optimizer += optim ? 1 : 0;
    total_bytes += tensor_bytes(t);
    shards += t.shards.size();
    for (const auto& s : t.shards) files.insert(s.file);
    json placements = json::array();
    for (const auto& p : t.placements) placements.push_back({{"dim", p.dim}, {"placement", p.placement.str()}});
    tensors.push_back({{"name", name},
                       {"kind", optim ? "optimizer" : "model"},
                       {"global_shape", t.global_shape},
                       {"dtype", dtype_text(t)},
                       {"bytes", tensor_bytes(t)},
                       {"placements", placements},
                       {"shards", t.shards.size()}});
  }

  // Which precision wrote it, as its run state records it (the tensors are
  // the fp32 masters either way).
  std::string precision = "not recorded (written before precisions were recorded, or imported)";
  std::string groups = "not recorded (written before parameter groups were recorded, or imported)";
  {
    std::ifstream in(fs::path(step_dir) / ckpt::kStateFileName);
    if (in) {
      try {
        const json state = json::parse(in);
        groups = state.value("optimizer_groups", groups);
        if (state.contains("precision")) {
          const auto& p = state.at("precision");
          precision = describe_precision(p.value("param_dtype", std::string()),
                                         p.value("reduce_dtype", std::string())) +
                      "; tensors are the fp32 masters";
        }
      } catch (const std::exception& e) {
        precision = std::string("not known (") + ckpt::kStateFileName + " does not parse: " + e.what() + ")";
      }
    }
  }
  if (as_json) {
    json out = {{"dir", step_dir},
                {"precision", precision},
                {"optimizer_groups", groups},
                {"step", m.step},
                {"format_version", m.format_version},
                {"layout", m.layout},
                {"config_hash", m.config_hash},
                {"state_xxh64", m.state_xxh64},
                {"config_file", m.config_file},
                {"tensors", tensors},
                {"totals",
                 {{"tensors", m.tensors.size()},
                  {"model_tensors", m.tensors.size() - optimizer},
                  {"optimizer_tensors", optimizer},
                  {"bytes", total_bytes},
                  {"shards", shards},
                  {"files", files.size()}}}};
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }

  std::printf("checkpoint   %s\n", step_dir.c_str());
  std::printf("step         %lld (format version %d)\n", static_cast<long long>(m.step),
              m.format_version);
  std::printf("layout       %s\n", format_layout(m.layout).c_str());
  std::printf("config       %s\n", !m.config_file.empty()
                                       ? (m.config_file + ", xxh64 " + m.config_hash).c_str()
                                       : "not stored (written before configs were)");
  std::printf("precision    %s\n", precision.c_str());
  std::printf("optimizer    %s\n", groups.c_str());
  std::printf("manifest     %s\n", m.checksum_file.empty()
                                       ? "no checksum (written before manifests had one)"
                                       : ("its xxh64 in " + m.checksum_file + ", checked").c_str());
  std::printf("state.json   %s\n", m.state_xxh64.empty()
                                       ? "no checksum in the manifest (written before they were)"
                                       : ("xxh64 " + m.state_xxh64).c_str());
  std::vector<std::vector<std::string>> rows = {
      {"tensor", "kind", "global shape", "dtype", "bytes", "placements", "shards"}};
  for (const auto& t : tensors) {
    const auto& rec = m.tensors.at(t["name"].get<std::string>());
    rows.push_back({t["name"].get<std::string>(), t["kind"].get<std::string>(),
                    ckpt::detail::format_shape(rec.global_shape), t["dtype"].get<std::string>(),
                    std::to_string(t["bytes"].get<std::uint64_t>()), split_text(rec),
                    std::to_string(rec.shards.size())});
  }
  std::vector<std::size_t> width(rows[0].size(), 0);
  for (const auto& r : rows) {
    for (std::size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  for (const auto& r : rows) {
    std::string line;
    for (std::size_t c = 0; c < r.size(); ++c) {
      // Numbers right-aligned, text left-aligned.
      const bool right = c == 4 || c == 6;
      const std::string pad(width[c] - r[c].size(), ' ');
      line += (c ? "  " : "") + (right ? pad + r[c] : r[c] + (c + 1 < r.size() ? pad : ""));
    }
    std::printf("%s\n", line.c_str());
  }
  std::printf(
      "total        %zu tensors (%zu model, %zu optimizer state), %llu bytes in %zu shards, "
      "%zu files\n",
      m.tensors.size(), m.tensors.size() - optimizer, optimizer,
      static_cast<unsigned long long>(total_bytes), shards, files.size());
  return 0;
}

}  // namespace hp::ckpt_tool
