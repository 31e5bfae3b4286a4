#include "framework/trainer/checkpoint_adapter.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>

#include "backends/dist/context.h"
#include "checkpoint/checkpoint.h"
#include "framework/config/config.h"

namespace hp {

namespace {
std::string rank_file(const char* kind, int rank) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-rank%05d.safetensors", kind, rank);
  return buf;
}

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

/// Concatenation along `dim` of every member's `t` (lengths may differ).
at::Tensor gather_along(dist::Group& g, const at::Tensor& t, std::int64_t dim) {
  // Exchange lengths, pad to the longest, gather, then trim.
  at::Tensor len = at::full({1}, t.size(dim), at::kLong);
  auto lens = g.all_gather_list(len);
  std::int64_t longest = 0;
  for (const auto& l : lens) longest = std::max(longest, l.item<std::int64_t>());
  at::Tensor padded = t.detach();
  if (t.size(dim) < longest) {
    auto shape = t.sizes().vec();
    shape[static_cast<std::size_t>(dim)] = longest - t.size(dim);
    padded = at::cat({padded, at::zeros(shape, t.options())}, dim);
  }
  auto parts = g.all_gather_list(padded.contiguous());
  std::vector<at::Tensor> trimmed;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    trimmed.push_back(parts[i].narrow(dim, 0, lens[i].item<std::int64_t>()));
  }
  return at::cat(trimmed, dim);
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
  if (!spec.sharded()) return t;
  const auto groups = spec.split_groups();
  at::Tensor out = t;
  // Inner levels hold consecutive sub-ranges of the outer slice, in member order.
  for (auto it = groups.rbegin(); it != groups.rend(); ++it) {
    auto& g = d.group(*it);
    if (g.size() > 1) out = gather_along(g, out, spec.split_dim);
  }
  return out;
}

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
  return s;
}

std::string model_config_hash(const Config& config) {
  std::string model_yaml;
  for (const auto& path : config.schema().paths_under("model.")) {
    model_yaml += path + "=" + to_string(config.value(path)) + ";";
  }
  return std::to_string(std::hash<std::string>{}(model_yaml));
}

SavedState load_checkpoint(const std::string& step_dir, const std::vector<ParamEntry>& params,
                           const std::vector<ParamEntry>& optimizer_state, const dist::DistributedContext& d) {
  ckpt::CheckpointReader reader(step_dir);
  auto restore = [&](const std::vector<ParamEntry>& entries, const char* what) {
    for (const auto& e : entries) {
      if (!reader.has(e.spec.name)) {
        throw ckpt::CheckpointError("checkpoint " + step_dir + " has no " + what + " tensor '" + e.spec.name +
                                    "' (was it written with another model or optimizer?)");
      }
      reader.check(e.spec.name, e.spec.global_shape, e.tensor.scalar_type());
      at::Tensor local = reader.read(e.spec.name, e.spec.offsets(), e.spec.local_shape());
      c10::NoGradGuard no_grad;
      const_cast<at::Tensor&>(e.tensor).copy_(local);
    }
  };
  restore(params, "model");
  // Imported weights carry no optimizer state: the optimizer starts fresh.
  const bool any_optimizer = std::any_of(optimizer_state.begin(), optimizer_state.end(),
                                         [&](const ParamEntry& e) { return reader.has(e.spec.name); });
  if (any_optimizer) restore(optimizer_state, "optimizer");
  const auto& s = reader.state();
  SavedState out;
  out.step = s.at("step").get<std::int64_t>();
  out.rng_hex = s.value("rng", std::string());
  // Same layout: this rank's own generator state; otherwise rank 0's.
  const int rank = d.rank();
  if (s.contains("rng_by_rank") && s.contains("rng_layout") &&
      s.at("rng_layout").get<std::string>() == d.mesh().shape() &&
      rank < static_cast<int>(s.at("rng_by_rank").size())) {
    out.rng_hex = s.at("rng_by_rank").at(static_cast<std::size_t>(rank)).get<std::string>();
  }
  if (s.contains("scheduler")) out.optimizer_steps = s.at("scheduler").at("optimizer_steps").get<std::int64_t>();
  if (s.contains("metrics")) {
    out.tokens_total = s.at("metrics").at("tokens_total").get<double>();
    out.samples_total = s.at("metrics").at("samples_total").get<double>();
  }
  return out;
}

CheckpointOptions CheckpointOptions::from(const Config& c) {
  CheckpointOptions o;
  o.root = c.get_string("checkpoint.dir");
  if (o.root.empty()) o.root = c.get_string("run.output_dir") + "/checkpoints";
  o.interval = c.get_int("checkpoint.interval");
  o.resume = c.get_string("checkpoint.resume");
  o.keep = static_cast<int>(c.get_int("checkpoint.keep"));
  return o;
}

std::string CheckpointOptions::resume_dir() const {
  if (resume == "never") return "";
  if (resume == "auto") return ckpt::CheckpointReader::latest(root);
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::path(resume) / "manifest.json", ec)) return resume;
  std::string latest = ckpt::CheckpointReader::latest(resume);
  if (latest.empty()) {
    throw std::runtime_error("checkpoint.resume = " + resume +
                             ": neither a checkpoint step directory (no manifest.json) nor a "
                             "checkpoint root with a 'latest' pointer");
  }
  return latest;
}

namespace {

class GatheredCheckpointIO : public CheckpointIO {
 public:
  GatheredCheckpointIO(CheckpointOptions o, const Config& config, dist::DistributedContext& dist)
      : o_(std::move(o)), config_(config), dist_(dist) {}

  void save(std::int64_t step, const std::vector<ParamEntry>& params, const std::vector<ParamEntry>& optimizer_state,
            const SavedState& state) override {
    const int rank = dist_.rank();
    const auto& mesh = dist_.mesh();
    auto& world = dist_.group("world");
    if (rank == 0) ckpt::CheckpointWriter::prepare(o_.root, step);
    world.barrier();
    auto full = [&](const std::vector<ParamEntry>& entries) {
      std::vector<ckpt::ShardedTensor> out;
      for (const auto& e : entries) {
        at::Tensor t = gather_full(dist_, e.spec, e.tensor.detach());
        out.push_back({e.spec.name, t.contiguous(), e.spec.global_shape,
                       std::vector<std::int64_t>(e.spec.global_shape.size(), 0), e.spec.split_dim,
                       e.spec.split_groups()});
      }
      return out;
    };
    // Every rank takes part in the gathers; only the leaders keep the result.
    auto model = full(params);
    const auto rngs = rng_states_by_rank(dist_);
    auto optim = full(optimizer_state);
    if (mesh.is_leader(rank)) {
      ckpt::CheckpointWriter w(o_.root, step, rank);
      w.write_file(rank_file("model", rank), model);
      if (!optim.empty()) w.write_file(rank_file("optim", rank), optim);
      w.finish_rank();
    }
    world.barrier();
    if (rank == 0) {
      ckpt::CheckpointWriter::commit(o_.root, step, run_state_json(state, rngs, config_, dist_), mesh.sizes(),
                                     model_config_hash(config_), o_.keep, mesh.leaders());
    }
    world.barrier();
  }

  SavedState load(const std::string& step_dir, const std::vector<ParamEntry>& params,
                  const std::vector<ParamEntry>& optimizer_state) override {
    return load_checkpoint(step_dir, params, optimizer_state, dist_);
  }

 private:
  CheckpointOptions o_;
  const Config& config_;
  dist::DistributedContext& dist_;
};

}  // namespace

std::unique_ptr<CheckpointIO> make_gathered_checkpoint_io(const CheckpointOptions& options, const Config& config,
                                                          dist::DistributedContext& dist) {
  return std::make_unique<GatheredCheckpointIO>(options, config, dist);
}

}  // namespace hp
