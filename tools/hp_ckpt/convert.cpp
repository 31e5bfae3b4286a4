// hp-ckpt convert DIR --to OUT: an offline re-shard into a committed
// checkpoint of the target layout, written by one CheckpointWriter per target
// rank. Each piece of the target layout is written once, by one of its
// holders, chosen by the sharded writer's rule (include/hp/checkpoint/write_plan.h), so
// replicas share the writing as they do in a run.
#include <ATen/ATen.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/error.h"
#include "checkpoint/reader.h"
#include "hp/checkpoint/write_plan.h"
#include "hp/checkpoint/writer.h"
#include "tools/hp_ckpt/hp_ckpt.h"
#include "tools/hp_ckpt/layout.h"
#include "tools/hp_ckpt/recut.h"

namespace hp::ckpt_tool {

namespace fs = std::filesystem;

int run_convert(const std::string& dir, const std::string& out, const TargetLayout& target) {
  const std::string step_dir = resolve_step_dir(dir);
  const ckpt::CheckpointReader reader(step_dir);
  const auto mesh = target_mesh(target.sizes, reader.manifest());
  const int world = mesh.world_size();
  const auto& manifest = reader.manifest();
  const fs::path final_dir = fs::path(out) / ckpt::step_dir_name(reader.step());
  std::error_code ec;
  if (fs::exists(final_dir, ec)) {
    throw UsageError("--to " + out + " already holds " + final_dir.filename().string() +
                     "; convert writes a new step there: choose another --to or remove it");
  }

  // Plan every piece before writing anything, so a bad size fails first:
  // each target rank lists the piece of every tensor it holds, and the
  // sharded writer's rule (include/hp/checkpoint/write_plan.h) picks one writer each.
  std::vector<std::vector<Piece>> held(static_cast<std::size_t>(world));
  std::vector<std::vector<ckpt::SliceDesc>> by_rank(static_cast<std::size_t>(world));
  for (const auto& [name, record] : manifest.tensors) {
    check_cut(name, record, mesh);  // refuses an unknown group or a size it does not divide
    for (int r = 0; r < world; ++r) {
      auto p = piece_of(name, record, mesh, r);
      by_rank[static_cast<std::size_t>(r)].push_back(
          {ckpt::slice_key(name, p.offsets, p.lengths), p.bytes});
      held[static_cast<std::size_t>(r)].push_back(std::move(p));
    }
  }
  const auto plan = ckpt::plan_writers(by_rank);
  std::size_t pieces = 0;
  for (const auto& mine : plan) pieces += mine.size();

  ckpt::CheckpointWriter::prepare(out, reader.step());
  std::vector<int> writers;
  for (int r = 0; r < world; ++r) {
    ckpt::CheckpointWriter w(out, reader.step(), r);
    std::vector<ckpt::ShardedTensor> model, optim;
    for (const auto i : plan[static_cast<std::size_t>(r)]) {
      const auto& p = held[static_cast<std::size_t>(r)][i];
      ckpt::ShardedTensor t{p.name,
                            reader.read(p.name, p.offsets, p.lengths),
                            p.record->global_shape,
                            p.offsets,
                            p.record->placements};
      (is_optimizer_state(*p.record) ? optim : model).push_back(std::move(t));
    }
    w.write_rank(model, optim);
    writers.push_back(r);
  }
  ckpt::CheckpointWriter::commit_with_mesh(out, reader.step(), reader.state(), mesh, reader.config_text(), 0, writers);
  std::printf(
      "converted step %lld from layout %s to %s: %zu tensors as %zu pieces written by %d "
      "ranks into %s\n",
      static_cast<long long>(reader.step()), format_layout(reader.layout()).c_str(),
      format_layout(layout_sizes(mesh)).c_str(), manifest.tensors.size(), pieces, world,
      final_dir.string().c_str());
  return 0;
}

}  // namespace hp::ckpt_tool
