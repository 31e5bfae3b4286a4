#include "hp/trainer/checkpoint_adapter.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "hp/comm/context.h"
#include "hp/comm/gather.h"
#include "checkpoint/checkpoint.h"
#include "hp/config/config.h"
#include "hp/logging/logging.h"

namespace hp {

namespace {
std::string hex_of(const at::Tensor& s) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  const auto* p = s.data_ptr<std::uint8_t>();
  for (std::int64_t i = 0; i < s.numel(); ++i) {
    out += digits[p[i] >> 4];
    out += digits[p[i] & 15];
  }
  return out;
}
}  // namespace

std::string rng_state_hex() { return hex_of(at::detail::getDefaultCPUGenerator().get_state()); }

void set_rng_state_hex(const std::string& hex) {
  at::Tensor s = at::empty({static_cast<std::int64_t>(hex.size() / 2)}, at::kByte);
  auto* p = s.data_ptr<std::uint8_t>();
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    p[i / 2] = static_cast<std::uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16));
  }
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  gen.set_state(s);
}

at::Tensor gather_full(dist::DistributedContext& d, const ShardSpec& spec, const at::Tensor& t) {
  at::Tensor out = t;
  // Inner placements cut what the outer ones left, in member order: gather
  // innermost first.
  for (auto it = spec.placements.rbegin(); it != spec.placements.rend(); ++it) {
    const auto& p = it->placement;
    if (p.kind != dist::Placement::Kind::kShard) {
      if (p.kind == dist::Placement::Kind::kReplicate) continue;
      throw std::logic_error("internal error: cannot gather '" + spec.name + "' placed " +
                             dist::describe(spec.placements) + " (only shards), please report");
    }
    auto& g = d.group(it->dim);
    if (g.size() > 1) out = at::cat(dist::all_gather_uneven(g, out, p.dim), p.dim);
  }
  return out;
}

namespace {

std::vector<std::string> rng_states_by_rank(dist::DistributedContext& d) {
  // Pipeline stages draw different streams: a resume on the same layout
  // gives each rank its own back.
  std::vector<at::Tensor> rngs{at::detail::getDefaultCPUGenerator().get_state()};
  auto& world = d.group("world");
  if (world.size() > 1) rngs = world.all_gather_list(rngs[0].contiguous());
  std::vector<std::string> out;
  for (const auto& r : rngs) out.push_back(hex_of(r));
  return out;
}

nlohmann::json run_state_json(const SavedState& state, const std::vector<std::string>& rngs_by_rank,
                              const Config& config, const dist::DistributedContext& d) {
  nlohmann::json s;
  s["step"] = state.step;
  s["rng"] = state.rng_hex;
  s["rng_by_rank"] = rngs_by_rank;
  s["rng_layout"] = d.mesh().shape();
  s["data"] = {{"step", state.step},
               {"samples_consumed", state.step * config.get_int("training.global_batch_size")}};
  s["scheduler"] = {{"optimizer_steps", state.optimizer_steps}};
  s["metrics"] = {{"tokens_total", state.tokens_total}, {"samples_total", state.samples_total}};
  if (!state.param_dtype.empty())
    s["precision"] = {{"param_dtype", state.param_dtype}, {"reduce_dtype", state.reduce_dtype}};
  if (!state.optimizer_groups.empty()) s["optimizer_groups"] = state.optimizer_groups;
  return s;
}

/// "a, b, c, d and 12 more"
std::string some_names(const std::vector<std::string>& names, std::size_t shown = 4) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < shown; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > shown) out += " and " + std::to_string(names.size() - shown) + " more";
  return out;
}

/// "3 model tensors (a, b, c)"
std::string counted(const std::vector<std::string>& names, const char* what) {
  return std::to_string(names.size()) + " " + what + " tensor" + (names.size() == 1 ? "" : "s") +
         " (" + some_names(names) + ")";
}

/// Every rank's names, joined: the whole model and optimizer, whatever the
/// partition of this rank.
std::set<std::string> names_over_world(dist::DistributedContext& d,
                                       const std::vector<std::string>& mine) {
  std::string text;
  for (const auto& n : mine) text += n + "\n";
  std::set<std::string> out;
  for (const auto& t : dist::all_gather_text(d.group("world"), text)) {
    std::size_t b = 0;
    for (std::size_t e = t.find('\n'); e != std::string::npos; b = e + 1, e = t.find('\n', b)) {
      out.insert(t.substr(b, e - b));
    }
  }
  return out;
}

bool in_optimizer_file(const ckpt::TensorRecord& r) {
  return !r.shards.empty() && ckpt::is_optimizer_file(r.shards.front().file);
}

}  // namespace

SavedState load_checkpoint(const std::string& step_dir, const std::vector<ParamEntry>& params,
                           const std::vector<ParamEntry>& optimizer_state,
                           dist::DistributedContext& d, bool strict) {
  ckpt::CheckpointReader reader(step_dir);
  // The whole run's names (a pipeline stage holds only its own blocks), so
  // every rank reaches the same verdict.
  std::vector<std::string> mine;
  for (const auto& e : params) mine.push_back("m" + e.spec.name);
  for (const auto& e : optimizer_state) mine.push_back("o" + e.spec.name);
  std::set<std::string> model_names, optim_names;
  for (const auto& n : names_over_world(d, mine))
    (n[0] == 'm' ? model_names : optim_names).insert(n.substr(1));
  // Imported weights carry no optimizer state: the optimizer starts fresh.
  const bool any_optimizer = std::any_of(optim_names.begin(), optim_names.end(),
                                         [&](const std::string& n) { return reader.has(n); });
  std::vector<std::string> extra_model, extra_optim, missing_model, missing_optim;
  for (const auto& [name, record] : reader.manifest().tensors) {
    if (model_names.count(name) || optim_names.count(name)) continue;
    (in_optimizer_file(record) ? extra_optim : extra_model).push_back(name);
  }
  for (const auto& n : model_names) {
    if (!reader.has(n)) missing_model.push_back(n);
  }
  if (any_optimizer) {
    for (const auto& n : optim_names) {
      if (!reader.has(n)) missing_optim.push_back(n);
    }
  }
  const std::string fix =
      "; checkpoint.strict: false loads the tensors that match and skips the rest (fine-tuning)";
  if (strict && !(extra_model.empty() && extra_optim.empty())) {
    std::string what;
    if (!extra_model.empty()) what = counted(extra_model, "model");
    if (!extra_optim.empty())
      what += (what.empty() ? "" : " and ") + counted(extra_optim, "optimizer");
    throw ckpt::CheckpointError(
        "checkpoint " + step_dir + " holds " + what +
        " that this run does not have (was it written with another model or optimizer?)" + fix);
  }
  if (strict && !missing_model.empty()) {
    throw ckpt::CheckpointError(
        "checkpoint " + step_dir + " has no model tensor '" + missing_model.front() + "'" +
        (missing_model.size() > 1 ? " (" + counted(missing_model, "model") + " missing)" : "") +
        " (was it written with another model or optimizer?)" + fix);
  }
  if (strict && !missing_optim.empty()) {
    throw ckpt::CheckpointError(
        "checkpoint " + step_dir + " has no optimizer tensor '" + missing_optim.front() + "'" +
        (missing_optim.size() > 1 ? " (" + counted(missing_optim, "optimizer") + " missing)" : "") +
        " (was it written with another model or optimizer?)" + fix);
  }
  if (!strict && d.rank() == 0) {
    std::vector<std::string> skipped = extra_model, kept = missing_model;
    skipped.insert(skipped.end(), extra_optim.begin(), extra_optim.end());
    kept.insert(kept.end(), missing_optim.begin(), missing_optim.end());
    log::logger()->info(
        "partial load from {} (checkpoint.strict: false): skipped {} checkpoint tensor{} this run "
        "does not have{}; "
        "{} tensor{} of this run not in the checkpoint keep their initial values{}",
        step_dir, skipped.size(), skipped.size() == 1 ? "" : "s",
        skipped.empty() ? "" : " (" + some_names(skipped) + ")", kept.size(),
        kept.size() == 1 ? "" : "s", kept.empty() ? "" : " (" + some_names(kept) + ")");
  }
  auto restore = [&](const std::vector<ParamEntry>& entries) {
    for (const auto& e : entries) {
      if (!reader.has(e.spec.name)) continue;  // partial: checked above
      reader.check(e.spec.name, e.spec.global_shape, e.tensor.scalar_type());
      at::Tensor local = reader.read(e.spec.name, e.spec.offsets(), e.spec.local_shape());
      c10::NoGradGuard no_grad;
      const_cast<at::Tensor&>(e.tensor).copy_(local);
    }
  };
  restore(params);
  if (any_optimizer) restore(optimizer_state);
  const auto& s = reader.state();
  SavedState out;
  out.config_text = reader.config_text();
  out.step = s.at("step").get<std::int64_t>();
  out.rng_hex = s.value("rng", std::string());
  // Same layout: this rank's own generator state; otherwise rank 0's.
  const int rank = d.rank();
  if (s.contains("rng_by_rank") && s.contains("rng_layout") &&
      s.at("rng_layout").get<std::string>() == d.mesh().shape() &&
      rank < static_cast<int>(s.at("rng_by_rank").size())) {
    out.rng_hex = s.at("rng_by_rank").at(static_cast<std::size_t>(rank)).get<std::string>();
  }
  if (s.contains("scheduler"))
    out.optimizer_steps = s.at("scheduler").at("optimizer_steps").get<std::int64_t>();
  if (s.contains("metrics")) {
    out.tokens_total = s.at("metrics").at("tokens_total").get<double>();
    out.samples_total = s.at("metrics").at("samples_total").get<double>();
  }
  if (s.contains("precision")) {
    out.param_dtype = s.at("precision").value("param_dtype", std::string());
    out.reduce_dtype = s.at("precision").value("reduce_dtype", std::string());
  }
  out.optimizer_groups = s.value("optimizer_groups", std::string());
  return out;
}

CheckpointOptions CheckpointOptions::from(const Config& c) {
  CheckpointOptions o;
  o.root = c.get_string("checkpoint.dir");
  if (o.root.empty()) o.root = c.get_string("run.output_dir") + "/checkpoints";
  o.interval = c.get_int("checkpoint.interval");
  o.resume = c.get_string("checkpoint.resume");
  o.keep = static_cast<int>(c.get_int("checkpoint.keep"));
  o.strict = c.get_bool("checkpoint.strict");
  return o;
}

std::string CheckpointOptions::resume_dir() const {
  if (resume == "never") return "";
  if (resume == "auto") return ckpt::CheckpointReader::latest(root);
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::path(resume) / ckpt::kManifestFileName, ec)) {
    return resume;
  }
  std::string latest = ckpt::CheckpointReader::latest(resume);
  if (latest.empty()) {
    throw std::runtime_error("checkpoint.resume = " + resume +
                             ": neither a checkpoint step directory (no manifest.json) nor a "
                             "checkpoint root with a 'latest' pointer");
  }
  return latest;
}

std::function<void()> step_commit(dist::DistributedContext& d, const CheckpointOptions& o,
                                  std::int64_t step, const SavedState& state,
                                  const Config& config, std::vector<int> writers) {
  const auto rngs = rng_states_by_rank(d);
  return [root = o.root, step, run_state = run_state_json(state, rngs, config, d),
          mesh = d.mesh(), config_text = config.to_yaml(), keep = o.keep, writers = std::move(writers)] {
    ckpt::CheckpointWriter::commit_with_mesh(root, step, run_state, mesh, config_text, keep, writers);
  };
}

void begin_save(dist::DistributedContext& d, const std::string& root, std::int64_t step) {
  if (d.rank() == 0) ckpt::CheckpointWriter::prepare(root, step);
  d.group("world").barrier();
}

void save_step(dist::DistributedContext& d, const std::string& root, std::int64_t step,
               const std::function<void()>& write, const std::function<void()>& commit) {
  auto& world = d.group("world");
  begin_save(d, root, step);
  write();
  world.barrier();
  if (d.rank() == 0) commit();
  world.barrier();
}

namespace {

class GatheredCheckpointIO : public CheckpointIO {
 public:
  GatheredCheckpointIO(CheckpointOptions o, const Config& config, dist::DistributedContext& dist)
      : o_(std::move(o)), config_(config), dist_(dist) {}

  void save(std::int64_t step, const std::vector<ParamEntry>& params,
            const std::vector<ParamEntry>& optimizer_state, const SavedState& state) override {
    const int rank = dist_.rank();
    const auto& mesh = dist_.mesh();
    auto full = [&](const std::vector<ParamEntry>& entries) {
      std::vector<ckpt::ShardedTensor> out;
      for (const auto& e : entries) {
        at::Tensor t = gather_full(dist_, e.spec, e.tensor.detach());
        out.push_back({e.spec.name, t.contiguous(), e.spec.global_shape,
                       std::vector<std::int64_t>(e.spec.global_shape.size(), 0), e.spec.placements});
      }
      return out;
    };
    const auto commit = step_commit(dist_, o_, step, state, config_, mesh.leaders());
    save_step(dist_, o_.root, step, [&] {
      // Every rank takes part in the gathers; only the leaders write the result.
      const auto model = full(params);
      const auto optim = full(optimizer_state);
      if (mesh.is_leader(rank)) {
        ckpt::CheckpointWriter(o_.root, step, rank).write_rank(model, optim);
      }
    }, commit);
  }

  SavedState load(const std::string& step_dir, const std::vector<ParamEntry>& params,
                  const std::vector<ParamEntry>& optimizer_state) override {
    return load_checkpoint(step_dir, params, optimizer_state, dist_, o_.strict);
  }

 private:
  CheckpointOptions o_;
  const Config& config_;
  dist::DistributedContext& dist_;
};

}  // namespace

std::unique_ptr<CheckpointIO> make_gathered_checkpoint_io(const CheckpointOptions& options,
                                                          const Config& config,
                                                          dist::DistributedContext& dist) {
  return std::make_unique<GatheredCheckpointIO>(options, config, dist);
}

}  // namespace hp
