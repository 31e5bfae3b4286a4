// hp-ckpt convert DIR --to OUT: an offline re-shard into a committed
// checkpoint of the target layout, written by one CheckpointWriter per target
// rank. Each piece of the target layout is written once, by the holder (among
// the ranks whose coordinates select it) with the fewest bytes so far, so
// replicas share the writing as the sharded writer does.
#include <ATen/ATen.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/error.h"
#include "checkpoint/reader.h"
#include "checkpoint/writer.h"
#include "tools/hp_ckpt/hp_ckpt.h"
#include "tools/hp_ckpt/layout.h"
#include "tools/hp_ckpt/recut.h"

namespace hp::ckpt_tool {
namespace {

namespace fs = std::filesystem;

std::string rank_file(const char* kind, int rank) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-rank%05d.safetensors", kind, rank);
  return buf;
}

}  // namespace

int run_convert(const std::string& dir, const std::string& out, const TargetLayout& target) {
  const std::string step_dir = resolve_step_dir(dir);
  const ckpt::CheckpointReader reader(step_dir);
  const auto mesh = target_mesh(target.sizes);
  const int world = mesh.world_size();
  const auto& manifest = reader.manifest();
  const fs::path final_dir = fs::path(out) / ckpt::CheckpointWriter::step_dir_name(reader.step());
  std::error_code ec;
  if (fs::exists(final_dir, ec)) {
    throw UsageError("--to " + out + " already holds " + final_dir.filename().string() +
                     "; convert writes a new step there: choose another --to or remove it");
  }

  // Plan every piece before writing anything, so a bad size fails first.
  std::vector<std::vector<Piece>> by_writer(static_cast<std::size_t>(world));
  std::vector<std::uint64_t> bytes(static_cast<std::size_t>(world), 0);
  std::size_t pieces = 0;
  for (const auto& [name, record] : manifest.tensors) {
    const auto count = piece_count(name, record, mesh);
    for (std::int64_t k = 0; k < count; ++k) {
      int writer = -1;
      for (int r = 0; r < world; ++r) {
        if (piece_index(record, mesh, r) == k &&
            (writer < 0 ||
             bytes[static_cast<std::size_t>(r)] < bytes[static_cast<std::size_t>(writer)])) {
          writer = r;
        }
      }
      auto p = piece(name, record, mesh, k);
      bytes[static_cast<std::size_t>(writer)] += p.bytes;
      by_writer[static_cast<std::size_t>(writer)].push_back(std::move(p));
      ++pieces;
    }
  }

  ckpt::CheckpointWriter::prepare(out, reader.step());
  std::vector<int> writers;
  for (int r = 0; r < world; ++r) {
    ckpt::CheckpointWriter w(out, reader.step(), r);
    std::vector<ckpt::ShardedTensor> model, optim;
    for (const auto& p : by_writer[static_cast<std::size_t>(r)]) {
      ckpt::ShardedTensor t{p.name,
                            reader.read(p.name, p.offsets, p.lengths),
                            p.record->global_shape,
                            p.offsets,
                            p.record->split_dim,
                            p.record->split_groups};
      (is_optimizer_state(*p.record) ? optim : model).push_back(std::move(t));
    }
    if (!model.empty()) w.write_file(rank_file("model", r), model);
    if (!optim.empty()) w.write_file(rank_file("optim", r), optim);
    w.finish_rank();
    writers.push_back(r);
  }
  ckpt::CheckpointWriter::commit(out, reader.step(), reader.state(), layout_sizes(mesh),
                                 reader.config_text(), 0, writers);
  std::printf(
      "converted step %lld from layout %s to %s: %zu tensors as %zu pieces written by %d "
      "ranks into %s\n",
      static_cast<long long>(reader.step()), format_layout(reader.layout()).c_str(),
      format_layout(layout_sizes(mesh)).c_str(), manifest.tensors.size(), pieces, world,
      final_dir.string().c_str());
  return 0;
}

}  // namespace hp::ckpt_tool
