#pragma once
// hp-ckpt's subcommands and the few helpers they share. Every subcommand
// reports a failure by throwing: UsageError (exit 2) for a mistake on the
// command line, anything else (exit 1) for a bad or unusable checkpoint.
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <utility>

#include "hp/checkpoint/manifest.h"

namespace hp::ckpt_tool {

/// A mistake on the command line (exit code 2).
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The step directory `dir` names: `dir` itself when it holds manifest.json,
/// else the step `dir/latest` points at. Throws (naming both) otherwise.
std::string resolve_step_dir(const std::string& dir);

/// True for optimizer state: a tensor every shard of which lives in an
/// optim-* file (as the trainer's checkpoint IOs write it).
bool is_optimizer_state(const ckpt::TensorRecord& tensor);

/// Bytes of the whole tensor.
std::uint64_t tensor_bytes(const ckpt::TensorRecord& tensor);

/// `text` as one line of at most a few hundred characters (newlines folded,
/// the rest cut), so no message carries a blob.
std::string one_line(std::string text);

/// "tp+dp"
std::string join(const std::vector<std::string>& parts, const std::string& sep);

/// "dp=2 ep=1 pp=1 tp=2"
std::string format_layout(const ckpt::Layout& layout);

/// Fails with UsageError when `path` exists and is not an empty directory.
void require_fresh_output(const std::string& path, const std::string& what);

/// A target layout: sizes by mesh dimension (layout_dims() in tools/hp_ckpt/layout.h;
/// a dimension not given is 1).
struct TargetLayout {
  std::map<std::string, int> sizes;
};

int run_inspect(const std::string& dir, bool json);
int run_verify(const std::string& dir);
int run_convert(const std::string& dir, const std::string& out, const TargetLayout& target);
int run_consolidate(const std::string& dir, const std::string& out);
int run_per_rank(const std::string& dir, const std::string& out, const TargetLayout& target);
int run_import(const std::string& file, const std::string& root);
int run_import_hf(const std::string& dir, const std::string& root);
/// `family` "" picks the family from the model keys.
int run_export_hf(const std::string& dir, const std::string& out, const std::string& family);

/// Writes `tensors` (whole, by global name) as the committed step 0 of a new
/// checkpoint root `root` (refused when it holds checkpoints): no optimizer
/// state, layout pp=1 dp=1 tp=1, state.json {"step": 0} plus `state`.
void write_step_zero(const std::string& root, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                     const std::map<std::string, std::string>& state);

}  // namespace hp::ckpt_tool
