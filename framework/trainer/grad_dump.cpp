#include "framework/trainer/grad_dump.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <system_error>

#include "hp/comm/mesh.h"
#include "backends/comm/rank_files.h"
#include "checkpoint/safetensors.h"

namespace hp {

std::vector<int> replicate_group(const dist::ProcessMesh& mesh, int rank, const ShardSpec& spec) {
  const auto groups = spec.split_groups();
  std::vector<int> out;
  const std::string stages = mesh.partition_dim();
  for (int r = 0; r < mesh.world_size(); ++r) {
    if (!stages.empty() && mesh.group_index(stages, r) != mesh.group_index(stages, rank)) continue;
    bool same = true;
    for (const auto& g : groups) same = same && mesh.group_index(g, r) == mesh.group_index(g, rank);
    if (same) out.push_back(r);
  }
  return out;
}

namespace {

/// Creates `dir` and returns "<dir>/<kind>-rank<RRRRR>.safetensors".
std::string rank_file(const std::string& dir, const std::string& kind, int rank) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error && !std::filesystem::is_directory(dir)) {
    throw std::runtime_error("cannot create the " + kind + " dump directory " + dir + ": " + error.message());
  }
  return dir + "/" + dist::rank_file_name(kind + "-", rank, ".safetensors");
}

/// What every dump file says of where it comes from, besides its format.
std::map<std::string, std::string> origin(const std::string& format, std::int64_t step,
                                          const dist::ProcessMesh& mesh, int rank) {
  return {{"format", format},
          {"step", std::to_string(step)},
          {"rank", std::to_string(rank)},
          {"world_size", std::to_string(mesh.world_size())},
          {"mesh", mesh.shape()}};
}

}  // namespace

std::string write_tensor_dump(const std::string& dir, const std::string& kind, std::int64_t step,
                              const std::vector<std::pair<std::string, at::Tensor>>& records,
                              const dist::ProcessMesh& mesh, int rank, const std::string& kernels) {
  const std::string path = rank_file(dir, kind, rank);
  auto meta = origin("hyperparallel tensor dump 1", step, mesh, rank);
  meta["tag"] = mesh.tag(rank);
  meta["kernels"] = kernels;
  ckpt::write_safetensors(path, records, meta);
  return path;
}

std::string write_grad_dump(const std::string& dir, std::int64_t step,
                            const std::vector<ParamEntry>& grads, const dist::ProcessMesh& mesh,
                            int rank) {
  const std::string path = rank_file(dir, "grads", rank);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  nlohmann::ordered_json placement = nlohmann::ordered_json::object();
  for (const auto& g : grads) {
    const ShardSpec& s = g.spec;
    const auto local = s.local_shape();
    // A parameter no loss reached has no gradient yet: it is zero.
    const at::Tensor t = g.tensor.defined() ? g.tensor.detach() : at::zeros(local, at::kFloat);
    if (t.sizes().vec() != local) {
      throw std::runtime_error("internal error: gradient " + s.name + " on rank " +
                               std::to_string(rank) +
                               " does not have the shape its ShardSpec gives, please report");
    }
    tensors.emplace_back(s.name, t.contiguous());
    placement[s.name] = {{"global_shape", s.global_shape},
                         {"offsets", s.offsets()},
                         {"shape", local},
                         {"placements", dist::describe(s.placements)},
                         {"replicas", replicate_group(mesh, rank, s)}};
  }
  auto meta = origin("hyperparallel gradient dump 1", step, mesh, rank);
  meta["placement"] = placement.dump();
  ckpt::write_safetensors(path, tensors, meta);
  return path;
}

}  // namespace hp
