#pragma once
// The names of a checkpoint's files and directories, spelled here and
// nowhere else: the writer, the reader, the trainer's and the plugins'
// checkpoint IOs and hp-ckpt all call these.
//
//   <root>/latest                          the committed step to resume from
//   <root>/step_00000100/                  a committed step
//   <root>/step_00000100.tmp/              the same step while it is written
//       model-rank00003.safetensors        rank 3's model tensors
//       optim-rank00003.safetensors        rank 3's optimizer state
//       shards-rank00003.json              rank 3's part of the manifest
//       failed-rank00003.txt               why rank 3's part will not come
//       manifest.json, manifest.json.xxh64, state.json, config.yaml
#include <cstdint>
#include <string>

namespace hp::ckpt {

/// "step_00000100"
std::string step_dir_name(std::int64_t step);
/// "<root>/step_00000100.tmp": where step `step` is written until its commit.
std::string staging_dir(const std::string& root, std::int64_t step);

/// "model-rank00003.safetensors" and "optim-rank00003.safetensors": the
/// files a rank's model tensors and optimizer state are written to.
std::string model_file_name(int rank);
std::string optim_file_name(int rank);
/// Whether `file_name` holds optimizer state: it starts like optim_file_name().
bool is_optimizer_file(const std::string& file_name);

/// "shards-rank00003.json": a rank's part of the manifest, and the rank of
/// such a name back (-1 for any other name).
std::string part_file_name(int rank);
int part_file_rank(const std::string& name);

/// "failed-rank00003.txt": one line saying why a rank's part of a step
/// written in the background will not come.
std::string failed_file_name(int rank);

/// The pointer file under the root naming the newest committed step.
constexpr const char* kLatestFileName = "latest";
constexpr const char* kManifestFileName = "manifest.json";
constexpr const char* kStateFileName = "state.json";

}  // namespace hp::ckpt
