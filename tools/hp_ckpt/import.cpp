// hp-ckpt import FILE.safetensors --to ROOT: full weights by global name
// into a committed step-0 checkpoint, so a run can start from weights made
// elsewhere and each rank reads only its slice.
#include <ATen/ATen.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "hp/comm/mesh.h"
#include "checkpoint/error.h"
#include "checkpoint/safetensors.h"
#include "hp/checkpoint/writer.h"
#include "tools/hp_ckpt/hp_ckpt.h"
#include "tools/hp_ckpt/layout.h"

namespace hp::ckpt_tool {

namespace fs = std::filesystem;

void write_step_zero(const std::string& root, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                     const std::map<std::string, std::string>& state) {
  std::error_code ec;
  if (fs::exists(fs::path(root) / ckpt::kLatestFileName, ec) ||
      fs::exists(fs::path(root) / ckpt::step_dir_name(0), ec)) {
    throw UsageError("--to " + root + " already holds checkpoints ('latest' or step_00000000); " +
                     "import writes step 0 of a new checkpoint root: choose another --to");
  }
  std::vector<ckpt::ShardedTensor> shards;
  for (const auto& [name, t] : tensors) {
    shards.push_back({name, t, t.sizes().vec(), std::vector<std::int64_t>(static_cast<std::size_t>(t.dim()), 0)});
  }
  ckpt::CheckpointWriter::prepare(root, 0);
  ckpt::CheckpointWriter w(root, 0, 0);
  w.write_rank(shards, {});
  nlohmann::json j = {{"step", 0}};
  for (const auto& [k, v] : state) j[k] = v;
  ckpt::CheckpointWriter::commit(root, 0, j, layout_sizes(layout_mesh({})), "", 0, {0});
}

int run_import(const std::string& file, const std::string& root) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) {
    throw UsageError(file +
                     " is not a file: give a safetensors file of full weights by global name");
  }
  const ckpt::SafetensorsReader in(file);
  if (in.names().empty()) {
    throw ckpt::CheckpointError("cannot import " + file + ": it holds no tensors");
  }
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::uint64_t bytes = 0;
  for (const auto& name : in.names()) {
    const auto& e = in.entry(name);
    tensors.emplace_back(name, in.read(name));
    bytes += e.end - e.begin;
  }
  write_step_zero(root, tensors, {{"imported_from", fs::absolute(file).string()}});
  std::printf("imported %zu tensors (%llu bytes) from %s as step 0 in %s\n", tensors.size(),
              static_cast<unsigned long long>(bytes), file.c_str(),
              (fs::path(root) / ckpt::step_dir_name(0)).string().c_str());
  return 0;
}

}  // namespace hp::ckpt_tool
