// hp-ckpt convert --consolidate / --per-rank: model weights as plain
// safetensors files for readers outside hyperparallel.
#include <ATen/ATen.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backends/comm/rank_files.h"
#include "checkpoint/error.h"
#include "checkpoint/reader.h"
#include "checkpoint/safetensors.h"
#include "tools/hp_ckpt/hp_ckpt.h"
#include "tools/hp_ckpt/layout.h"
#include "tools/hp_ckpt/recut.h"

namespace hp::ckpt_tool {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

void make_dir(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec && !fs::is_directory(dir)) {
    throw ckpt::CheckpointError("cannot create directory " + dir.string() + ": " + ec.message());
  }
}

void write_json(const fs::path& path, const json& j) {
  std::ofstream f(path);
  f << j.dump(2) << "\n";
  f.close();
  if (!f) {
    throw ckpt::CheckpointError("cannot write " + path.string());
  }
}

/// What config.json says of the source checkpoint.
json source_config(const ckpt::CheckpointReader& reader) {
  const auto& state = reader.state();
  json j = {{"step", reader.step()},
            {"layout", reader.layout()},
            {"config_hash", reader.config_hash()},
            {"source", reader.dir()}};
  j["state_step"] = state.is_object() && state.contains("step") ? state["step"] : json(nullptr);
  return j;
}

}  // namespace

int run_consolidate(const std::string& dir, const std::string& out) {
  const std::string step_dir = resolve_step_dir(dir);
  const ckpt::CheckpointReader reader(step_dir);
  require_fresh_output(out, "--consolidate");
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::uint64_t bytes = 0;
  for (const auto& [name, record] : reader.manifest().tensors) {
    if (is_optimizer_state(record)) continue;
    tensors.emplace_back(name, reader.read_full(name));
    bytes += tensor_bytes(record);
  }
  make_dir(out);
  const fs::path file = fs::path(out) / "model.safetensors";
  ckpt::write_safetensors(file.string(), tensors,
                          {{"format", "pt"},
                           {"hp_step", std::to_string(reader.step())},
                           {"hp_config_hash", reader.config_hash()}});
  json config = source_config(reader);
  config["format"] = "hyperparallel consolidated model weights";
  config["weights"] = "model.safetensors";
  config["tensors"] = tensors.size();
  write_json(fs::path(out) / "config.json", config);
  std::printf("consolidated step %lld: %zu model tensors (%llu bytes) into %s, with config.json\n",
              static_cast<long long>(reader.step()), tensors.size(),
              static_cast<unsigned long long>(bytes), file.string().c_str());
  return 0;
}

int run_per_rank(const std::string& dir, const std::string& out, const TargetLayout& target) {
  const std::string step_dir = resolve_step_dir(dir);
  const ckpt::CheckpointReader reader(step_dir);
  const auto mesh = target_mesh(target.sizes, reader.manifest());
  const std::string stages = mesh.partition_dim();
  if (mesh.group_size(stages) != 1) {
    throw UsageError("--per-rank with --" + stages + " " + std::to_string(mesh.group_size(stages)) +
                     ": pipeline stages hold blocks chosen by the trainer's cost-balanced split, "
                     "which a checkpoint does not record; use --pp 1 (every rank directory then "
                     "holds every block) or load the checkpoint with resharding");
  }
  require_fresh_output(out, "--per-rank");
  std::vector<std::string> model;
  for (const auto& [name, record] : reader.manifest().tensors) {
    if (is_optimizer_state(record)) continue;
    check_cut(name, record, mesh);  // refuses a size the layout does not divide, before writing
    model.push_back(name);
  }
  make_dir(out);
  json ranks = json::array();
  for (int r = 0; r < mesh.world_size(); ++r) {
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    json slices = json::object();
    for (const auto& name : model) {
      const auto& record = reader.manifest().tensors.at(name);
      const auto p = piece_of(name, record, mesh, r);
      tensors.emplace_back(name, reader.read(name, p.offsets, p.lengths));
      slices[name] = {{"global_shape", record.global_shape}, {"offsets", p.offsets}};
    }
    const std::string sub = dist::rank_file_name("", r, "");
    const fs::path rank_dir = fs::path(out) / sub;
    make_dir(rank_dir);
    ckpt::write_safetensors((rank_dir / "model.safetensors").string(), tensors,
                            {{"format", "pt"},
                             {"hp_step", std::to_string(reader.step())},
                             {"hp_rank", std::to_string(r)},
                             {"hp_coords", describe_rank(mesh, r)},
                             {"hp_slices", slices.dump()}});
    json entry = {{"rank", r}, {"dir", sub}};
    for (const auto& g : mesh.group_names()) {
      if (g != "world") entry[g] = mesh.group_index(g, r);
    }
    ranks.push_back(entry);
  }
  json config = source_config(reader);
  config["format"] = "hyperparallel per-rank model weights";
  config["target_layout"] = layout_sizes(mesh);
  config["rank_numbering"] =
      "rank = (pp * dp_size + dp) * tp_size + tp; ep = dp % ep_size; edp = dp / ep_size";
  config["ranks"] = ranks;
  write_json(fs::path(out) / "config.json", config);
  std::printf(
      "wrote step %lld for layout %s: %d rank directories of %zu model tensors each under "
      "%s\n",
      static_cast<long long>(reader.step()), format_layout(layout_sizes(mesh)).c_str(),
      mesh.world_size(), model.size(), out.c_str());
  return 0;
}

}  // namespace hp::ckpt_tool
