#include "framework/trainer/checkpoint_adapter.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <functional>

#include "backends/dist/context.h"
#include "checkpoint/checkpoint.h"
#include "framework/config/config.h"

namespace hp {

namespace {
bool is_writer(dist::DistributedContext* d) {
  if (!d) return true;
  auto c = d->coord();
  return c.dp == 0 && c.tp == 0;
}
std::string rank_file(const char* kind, int rank) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-rank%05d.safetensors", kind, rank);
  return buf;
}
void barrier(dist::DistributedContext* d) {
  if (d) d->group("world").barrier();
}
}  // namespace

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

at::Tensor gather_full(dist::DistributedContext* d, const ShardSpec& spec, const at::Tensor& t) {
  if (!spec.sharded() || !d) return t;
  auto& g = d->group(spec.split_group);
  if (g.size() == 1) return t;
  // Shards may be uneven (vocabulary splits): exchange lengths, pad to the
  // longest, gather, then trim.
  at::Tensor len = at::full({1}, spec.length, at::kLong);
  auto lens = g.all_gather_list(len);
  std::int64_t longest = 0;
  for (const auto& l : lens) longest = std::max(longest, l.item<std::int64_t>());
  at::Tensor padded = t.detach();
  if (spec.length < longest) {
    auto shape = t.sizes().vec();
    shape[static_cast<std::size_t>(spec.split_dim)] = longest - spec.length;
    padded = at::cat({padded, at::zeros(shape, t.options())}, spec.split_dim);
  }
  auto parts = g.all_gather_list(padded.contiguous());
  std::vector<at::Tensor> trimmed;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    trimmed.push_back(parts[i].narrow(spec.split_dim, 0, lens[i].item<std::int64_t>()));
  }
  return at::cat(trimmed, spec.split_dim);
}

CheckpointAdapter::CheckpointAdapter(const Config& config, dist::DistributedContext* dist)
    : config_(config), dist_(dist) {
  root_ = config.get_string("checkpoint.dir");
  if (root_.empty()) root_ = config.get_string("run.output_dir") + "/checkpoints";
  keep_ = static_cast<int>(config.get_int("checkpoint.keep"));
}

std::string CheckpointAdapter::resume_dir() const {
  const std::string& r = config_.get_string("checkpoint.resume");
  if (r == "never") return "";
  if (r == "auto") return ckpt::CheckpointReader::latest(root_);
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::path(r) / "manifest.json", ec)) return r;
  std::string latest = ckpt::CheckpointReader::latest(r);
  if (latest.empty()) {
    throw std::runtime_error("checkpoint.resume = " + r +
                             ": neither a checkpoint step directory (no manifest.json) nor a "
                             "checkpoint root with a 'latest' pointer");
  }
  return latest;
}

double CheckpointAdapter::save(std::int64_t step, const std::vector<ParamEntry>& params,
                               const std::vector<ParamEntry>& optimizer_state,
                               const SavedState& state) {
  const auto t0 = std::chrono::steady_clock::now();
  const int rank = dist_ ? dist_->rank() : 0;
  if (rank == 0) ckpt::CheckpointWriter::prepare(root_, step);
  barrier(dist_);
  auto full = [&](const std::vector<ParamEntry>& entries) {
    std::vector<ckpt::ShardedTensor> out;
    for (const auto& e : entries) {
      at::Tensor t = gather_full(dist_, e.spec, e.tensor.detach());
      out.push_back({e.spec.name, t.contiguous(), e.spec.global_shape,
                     std::vector<std::int64_t>(e.spec.global_shape.size(), 0)});
    }
    return out;
  };
  // Every rank takes part in the gathers; only writers keep the result.
  auto model = full(params);
  // Each rank's generator (pipeline stages draw different streams): rank 0
  // keeps them all, and a resume on the same layout gives each its own back.
  std::vector<at::Tensor> rngs{at::detail::getDefaultCPUGenerator().get_state()};
  if (dist_ && dist_->world_size() > 1) rngs = dist_->group("world").all_gather_list(rngs[0].contiguous());
  auto optim = full(optimizer_state);
  if (is_writer(dist_)) {
    ckpt::CheckpointWriter w(root_, step, rank);
    w.write_file(rank_file("model", rank), model);
    if (!optim.empty()) w.write_file(rank_file("optim", rank), optim);
    w.finish_rank();
  }
  barrier(dist_);
  if (rank == 0) {
    nlohmann::json s;
    s["step"] = state.step;
    s["rng"] = state.rng_hex;
    s["rng_by_rank"] = nlohmann::json::array();
    for (const auto& r : rngs) s["rng_by_rank"].push_back(hex_of(r));
    s["rng_layout"] = dist_ ? dist_->mesh().shape() : std::string("pp=1 dp=1 tp=1 ep=1");
    s["data"] = {{"step", state.step},
                 {"samples_consumed", state.step * config_.get_int("training.global_batch_size")}};
    s["scheduler"] = {{"optimizer_steps", state.optimizer_steps}};
    s["metrics"] = {{"tokens_total", state.tokens_total}, {"samples_total", state.samples_total}};
    ckpt::Layout layout;
    if (dist_) {
      const auto& m = dist_->mesh();
      layout = {{"pp", m.pp_size()}, {"dp", m.dp_size()}, {"tp", m.tp_size()}, {"ep", m.ep_size()}};
    } else {
      layout = {{"pp", 1}, {"dp", 1}, {"tp", 1}, {"ep", 1}};
    }
    std::string model_yaml;
    for (const auto& path : config_.schema().paths_under("model.")) {
      model_yaml += path + "=" + to_string(config_.value(path)) + ";";
    }
    // The writers: the dp 0, tp 0 rank of every pipeline stage.
    std::vector<int> writers{0};
    if (dist_) {
      writers.clear();
      for (int p = 0; p < dist_->mesh().pp_size(); ++p) writers.push_back(dist_->mesh().rank_of(p, 0, 0));
    }
    ckpt::CheckpointWriter::commit(root_, step, s, layout,
                                   std::to_string(std::hash<std::string>{}(model_yaml)), keep_, writers);
  }
  barrier(dist_);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

SavedState CheckpointAdapter::load(const std::string& step_dir, const std::vector<ParamEntry>& params,
                                   const std::vector<ParamEntry>& optimizer_state) {
  ckpt::CheckpointReader reader(step_dir);
  auto restore = [&](const std::vector<ParamEntry>& entries, const char* what) {
    for (const auto& e : entries) {
      if (!reader.has(e.spec.name)) {
        throw ckpt::CheckpointError("checkpoint " + step_dir + " has no " + what + " tensor '" +
                                    e.spec.name + "' (was it written with another model or optimizer?)");
      }
      reader.check(e.spec.name, e.spec.global_shape, e.tensor.scalar_type());
      at::Tensor local = reader.read(e.spec.name, e.spec.offsets(), e.spec.local_shape());
      c10::NoGradGuard no_grad;
      e.tensor.copy_(local);
    }
  };
  restore(params, "model");
  restore(optimizer_state, "optimizer");
  const auto& s = reader.state();
  SavedState out;
  out.step = s.at("step").get<std::int64_t>();
  out.rng_hex = s.at("rng").get<std::string>();
  // Same layout: this rank's own generator state; otherwise rank 0's.
  const int rank = dist_ ? dist_->rank() : 0;
  const std::string layout = dist_ ? dist_->mesh().shape() : std::string("pp=1 dp=1 tp=1 ep=1");
  if (s.contains("rng_by_rank") && s.contains("rng_layout") && s.at("rng_layout").get<std::string>() == layout &&
      rank < static_cast<int>(s.at("rng_by_rank").size())) {
    out.rng_hex = s.at("rng_by_rank").at(static_cast<std::size_t>(rank)).get<std::string>();
  }
  out.optimizer_steps = s.at("scheduler").at("optimizer_steps").get<std::int64_t>();
  out.tokens_total = s.at("metrics").at("tokens_total").get<double>();
  out.samples_total = s.at("metrics").at("samples_total").get<double>();
  return out;
}

}  // namespace hp
