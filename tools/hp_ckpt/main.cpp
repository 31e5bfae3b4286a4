// hp-ckpt: inspect, verify, convert, import and export hyperparallel checkpoints.
// Exit codes: 0 success, 1 a bad or unusable checkpoint (one line naming the
// file and the tensor), 2 a usage error.
#include <c10/util/Exception.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <map>
#include <string>

#include "hp/comm/mesh.h"
#include "checkpoint/error.h"
#include "tools/exit_now.h"
#include "tools/hp_ckpt/hp_ckpt.h"
#include "tools/hp_ckpt/layout.h"

namespace {

constexpr const char* kConvertHelp = R"(
Default: OUT is a checkpoint root; it receives a committed step (same step
number, state.json copied, the target layout recorded) of the layout
--tp/--dp/--ep/--pp (each 1 when not given). A tensor is cut by the
placements its manifest records (outermost first; "split" in a version-1
manifest), at each target rank's coordinates, as the trainer cuts it; the
sizes must divide each split dimension evenly. A tensor with no placement
recorded stays whole. Each piece is written once by one of the target ranks
holding it (model-rankNNNNN / optim-rankNNNNN files). --pp only sets the
layout recorded and the number of writers: pipeline stages hold whole blocks,
chosen by the trainer (a checkpoint does not record which), and any layout
loads any other.

--consolidate: OUT is a new directory with model.safetensors (every model
tensor whole, by global name; optimizer state, i.e. tensors stored in optim-*
files, is left out) and config.json (step, layout, config hash, state step).

--per-rank: OUT is a new directory with rankNNNNN/model.safetensors per
target rank, holding only that rank's slices of the model tensors (its
__metadata__ hp_slices gives each slice's global shape and offsets), and
config.json listing every rank's coordinates. Ranks are numbered as the
trainer's mesh: rank = (pp * dp_size + dp) * tp_size + tp (tp fastest, then
dp, then pp); the expert-parallel index is dp % ep_size and the
expert-data-parallel index dp / ep_size. --pp must be 1 (stages hold blocks
chosen by the trainer, not recorded in a checkpoint).)";

constexpr const char* kImportHelp = R"(
FILE is a safetensors file of whole tensors by global name (as the model
names its parameters). ROOT receives step_00000000 (one shard per tensor, all
in model-rank00000.safetensors, no split recorded), with `latest` pointing at
it. Its state.json holds only {"step": 0, "imported_from": FILE}: no RNG, data
position or optimizer state, and the checkpoint holds no optimizer tensors, so
a run resuming from it starts a fresh optimizer and seeds its RNG from the
config. Layout recorded: pp=1 dp=1 tp=1 ep=1; config hash empty. ROOT must
not already hold checkpoints.)";

int run(int argc, char** argv) {
  namespace tool = hp::ckpt_tool;
  CLI::App app{
      "hp-ckpt: inspect, verify, convert and import hyperparallel checkpoints.\n"
      "DIR is a step directory (holding manifest.json) or a checkpoint root (its "
      "`latest` step is used).\nExit codes: 0 success, 1 bad or unusable checkpoint, "
      "2 usage error."};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Help for every subcommand");

  std::string dir, out, file;
  bool json = false, consolidate = false, per_rank = false;
  tool::TargetLayout target;

  auto* inspect = app.add_subcommand(
      "inspect",
      "Step, layout, config hash, and per tensor: global shape, dtype, bytes, placements "
      "(e.g. 'tp:S(0) dp:S(0)'; '-' when whole or not recorded) and shard count");
  inspect->add_option("dir", dir, "Step directory or checkpoint root")->required();
  inspect->add_flag("--json", json, "Machine-readable output");

  auto* verify = app.add_subcommand(
      "verify",
      "manifest.json against its checksum (manifest.json.xxh64), every shard's checksum, "
      "header and byte range, every tensor's tiling, and "
      "state.json against the manifest; exit 0 with one OK line, or 1 with the first "
      "bad file and tensor");
  verify->add_option("dir", dir, "Step directory or checkpoint root")->required();

  auto* convert = app.add_subcommand(
      "convert",
      "Re-shard offline into a checkpoint of another layout, or write the model weights "
      "as one safetensors file (--consolidate) or one per rank (--per-rank)");
  convert->footer(kConvertHelp);
  convert->add_option("dir", dir, "Step directory or checkpoint root")->required();
  convert->add_option("--to", out, "Output (see above)")->required();
  // A shorthand per shipped mesh dimension (--tp, --dp, --ep, --pp), and
  // --size NAME=N for any dimension the checkpoint's mesh has.
  std::vector<CLI::Option*> sizes;
  std::map<std::string, int> shorthand;
  for (const auto& dim : hp::ckpt_tool::layout_dims()) {
    shorthand[dim] = 1;
    sizes.push_back(convert->add_option("--" + dim, shorthand[dim], "Target " + dim + " size (default 1)"));
  }
  std::vector<std::string> named_sizes;
  sizes.push_back(convert->add_option("--size", named_sizes,
                                      "Target size of any mesh dimension the checkpoint records, NAME=N "
                                      "(repeatable; e.g. --size cp=2); a dimension not given is 1"));
  auto* cons = convert->add_flag("--consolidate", consolidate,
                                 "One plain safetensors file of the full model weights");
  auto* per = convert->add_flag("--per-rank", per_rank,
                                "One directory per target rank with only its model slices");
  cons->excludes(per);
  for (auto* o : sizes) cons->excludes(o);

  std::string from_hf, to_hf, family;
  auto* import = app.add_subcommand(
      "import",
      "Full weights by global name (one safetensors file), or a Hugging Face model directory "
      "(--from-hf), into a new checkpoint root as a committed step 0");
  import->footer(kImportHelp);
  auto* import_file = import->add_option("file", file, "safetensors file of full weights by global name");
  auto* import_hf = import->add_option("--from-hf", from_hf,
                                       "Hugging Face model directory: config.json and model.safetensors (or a "
                                       "sharded model.safetensors.index.json) of the Llama, Mistral, Qwen2, Qwen3, "
                                       "Mixtral or Qwen3-MoE family; the model keys go to ROOT/model.yaml");
  import_file->excludes(import_hf);
  import->add_option("--to", out, "New checkpoint root")->required();

  auto* hf_export = app.add_subcommand(
      "export", "A llama-kind checkpoint's weights in the Hugging Face layout: config.json and model.safetensors (fp32)");
  hf_export->add_option("dir", dir, "Step directory or checkpoint root")->required();
  hf_export->add_option("--to-hf", to_hf, "New directory for config.json and model.safetensors")->required();
  hf_export->add_option("--family", family,
                        "llama, mistral, qwen2, qwen3, mixtral or qwen3_moe (default: from the model keys: "
                        "qwen3 with a QK-norm, qwen2 with q/k/v biases, mixtral or qwen3_moe with experts, else llama)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  const std::string command = app.get_subcommands().front()->get_name();
  for (std::size_t i = 0; i < hp::ckpt_tool::layout_dims().size(); ++i) {
    const auto& dim = hp::ckpt_tool::layout_dims()[i];
    if (sizes[i]->count() > 0) target.sizes[dim] = shorthand[dim];
  }
  for (const auto& text : named_sizes) {
    const auto eq = text.find('=');
    int n = 0;
    try {
      std::size_t used = 0;
      n = eq == std::string::npos ? 0 : std::stoi(text.substr(eq + 1), &used);
      if (eq != std::string::npos && used != text.size() - eq - 1) n = 0;
    } catch (const std::exception&) {
      n = 0;
    }
    if (eq == std::string::npos || eq == 0 || n < 1) {
      std::fprintf(stderr, "hp-ckpt %s: --size %s: not NAME=N with N at least 1 (e.g. --size tp=2)\n", command.c_str(),
                   text.c_str());
      return 2;
    }
    target.sizes[text.substr(0, eq)] = n;
  }
  try {
    if (*inspect) return tool::run_inspect(dir, json);
    if (*verify) return tool::run_verify(dir);
    if (*import) {
      if (!from_hf.empty()) return tool::run_import_hf(from_hf, out);
      if (file.empty()) throw tool::UsageError("give a safetensors FILE or --from-hf DIR");
      return tool::run_import(file, out);
    }
    if (*hf_export) return tool::run_export_hf(dir, to_hf, family);
    if (consolidate) return tool::run_consolidate(dir, out);
    if (per_rank) return tool::run_per_rank(dir, out, target);
    return tool::run_convert(dir, out, target);
  } catch (const tool::UsageError& e) {
    std::fprintf(stderr, "hp-ckpt %s: %s\n", command.c_str(), tool::one_line(e.what()).c_str());
    return 2;
  } catch (const hp::ckpt::CheckpointError& e) {
    std::fprintf(stderr, "hp-ckpt %s: %s\n", command.c_str(), tool::one_line(e.what()).c_str());
    return 1;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "hp-ckpt %s: %s\n", command.c_str(),
                 tool::one_line(e.what_without_backtrace()).c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hp-ckpt %s: %s\n", command.c_str(), tool::one_line(e.what()).c_str());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) { hp::tools::exit_now(run(argc, argv)); }
