// hp-ckpt import --from-hf DIR --to ROOT and hp-ckpt export STEP --to-hf DIR:
// weights in the Hugging Face layout of the Llama family (Llama, Mistral,
// Qwen2, Qwen3, Mixtral, Qwen3-MoE), both ways. One table per family says
// how its tensors are named; the shapes follow from the model keys, which
// are mapped from config.json (import) or from the checkpoint's stored config
// (export). Experts, one HF tensor each, are stacked into this project's
// [experts, ...] tensors and cut apart again.
#include <ATen/ATen.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/error.h"
#include "checkpoint/reader.h"
#include "checkpoint/safetensors.h"
#include "framework/model/registry.h"
#include "hp/checkpoint/file_names.h"
#include "tools/hp_ckpt/hp_ckpt.h"

namespace hp::ckpt_tool {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

/// How one family names its tensors (per layer, after "model.layers.{i}.").
struct Family {
  const char* model_type;    ///< config.json "model_type"
  const char* architecture;  ///< config.json "architectures"[0]
  bool qkv_bias = false;     ///< Qwen2: biases on q, k, v
  bool qk_norm = false;      ///< Qwen3: q_norm, k_norm
  bool moe = false;
  const char* moe_prefix = "";  ///< "block_sparse_moe" (Mixtral), "mlp" (Qwen3-MoE)
  const char* router = "";      ///< under moe_prefix
  const char* gate = "gate_proj";  ///< an FFN's (or expert's) gate, up and down names
  const char* up = "up_proj";
  const char* down = "down_proj";
};

const Family kFamilies[] = {
    {"llama", "LlamaForCausalLM"},
    {"mistral", "MistralForCausalLM"},
    {"qwen2", "Qwen2ForCausalLM", true},
    {"qwen3", "Qwen3ForCausalLM", false, true},
    {"mixtral", "MixtralForCausalLM", false, false, true, "block_sparse_moe", "gate", "w1", "w3", "w2"},
    {"qwen3_moe", "Qwen3MoeForCausalLM", false, true, true, "mlp", "gate"},
};

const Family& family_named(const std::string& model_type) {
  for (const auto& f : kFamilies)
    if (model_type == f.model_type) return f;
  std::string known;
  for (const auto& f : kFamilies) known += (known.empty() ? "" : ", ") + std::string(f.model_type);
  throw UsageError("config.json model_type '" + model_type + "' is not a family this tool maps (known: " + known +
                   ")");
}

/// The model keys both directions work from.
struct Dims {
  std::int64_t vocab = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0, ffn = 0, seq = 0;
  double norm_eps = 1e-5, rope_theta = 10000.0;
  bool tied = false, qk_norm = false, qkv_bias = false;
  std::int64_t experts = 0, top_k = 0, expert_ffn = 0;
  bool renormalize = true;
  std::int64_t head_dim() const { return hidden / heads; }
};

/// One HF tensor: its name, this project's tensor, the expert index within
/// it (-1: the whole tensor) and the HF shape.
struct Entry {
  std::string hf, hp;
  std::int64_t expert = -1;
  std::vector<std::int64_t> shape;
};

std::vector<Entry> name_map(const Family& f, const Dims& d) {
  const std::int64_t H = d.hidden, hd = d.head_dim(), KV = d.kv_heads * hd;
  std::vector<Entry> out;
  out.push_back({"model.embed_tokens.weight", "embed.tok.weight", -1, {d.vocab, H}});
  for (std::int64_t i = 0; i < d.layers; ++i) {
    const std::string L = "model.layers." + std::to_string(i) + ".", B = "blocks." + std::to_string(i) + ".";
    out.push_back({L + "input_layernorm.weight", B + "ln1.weight", -1, {H}});
    out.push_back({L + "self_attn.q_proj.weight", B + "attn.q.weight", -1, {H, H}});
    out.push_back({L + "self_attn.k_proj.weight", B + "attn.k.weight", -1, {KV, H}});
    out.push_back({L + "self_attn.v_proj.weight", B + "attn.v.weight", -1, {KV, H}});
    if (f.qkv_bias) {
      out.push_back({L + "self_attn.q_proj.bias", B + "attn.q.bias", -1, {H}});
      out.push_back({L + "self_attn.k_proj.bias", B + "attn.k.bias", -1, {KV}});
      out.push_back({L + "self_attn.v_proj.bias", B + "attn.v.bias", -1, {KV}});
    }
    out.push_back({L + "self_attn.o_proj.weight", B + "attn.proj.weight", -1, {H, H}});
    if (f.qk_norm) {
      out.push_back({L + "self_attn.q_norm.weight", B + "attn.q_norm.weight", -1, {hd}});
      out.push_back({L + "self_attn.k_norm.weight", B + "attn.k_norm.weight", -1, {hd}});
    }
    out.push_back({L + "post_attention_layernorm.weight", B + "ln2.weight", -1, {H}});
    if (!f.moe) {
      out.push_back({L + "mlp.gate_proj.weight", B + "mlp.gate.weight", -1, {d.ffn, H}});
      out.push_back({L + "mlp.up_proj.weight", B + "mlp.up.weight", -1, {d.ffn, H}});
      out.push_back({L + "mlp.down_proj.weight", B + "mlp.down.weight", -1, {H, d.ffn}});
      continue;
    }
    const std::string M = L + f.moe_prefix + ".";
    out.push_back({M + f.router + ".weight", B + "moe.router.weight", -1, {d.experts, H}});
    for (std::int64_t e = 0; e < d.experts; ++e) {
      const std::string X = M + "experts." + std::to_string(e) + ".";
      out.push_back({X + f.gate + ".weight", B + "moe.experts.gate.weight", e, {d.expert_ffn, H}});
      out.push_back({X + f.up + ".weight", B + "moe.experts.up.weight", e, {d.expert_ffn, H}});
      out.push_back({X + f.down + ".weight", B + "moe.experts.down.weight", e, {H, d.expert_ffn}});
    }
  }
  out.push_back({"model.norm.weight", "head.ln.weight", -1, {H}});
  if (!d.tied) out.push_back({"lm_head.weight", "head.out.weight", -1, {d.vocab, H}});
  return out;
}

std::string shape_text(const std::vector<std::int64_t>& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// ---- import ----

std::int64_t need_int(const json& c, const char* key, const std::string& file) {
  if (!c.contains(key) || !c.at(key).is_number_integer())
    throw ckpt::CheckpointError(file + ": '" + key + "' is missing or not an integer");
  return c.at(key).get<std::int64_t>();
}

/// config.json -> the model keys (refusing what this project's llama kind
/// does not compute: other activations, rope scaling, a head width other
/// than hidden / heads, experts on some layers only).
Dims dims_from_hf(const json& c, const Family& f, const std::string& file) {
  Dims d;
  d.vocab = need_int(c, "vocab_size", file);
  d.hidden = need_int(c, "hidden_size", file);
  d.layers = need_int(c, "num_hidden_layers", file);
  d.heads = need_int(c, "num_attention_heads", file);
  d.kv_heads = c.value("num_key_value_heads", d.heads);
  d.seq = c.value("max_position_embeddings", std::int64_t{2048});
  d.norm_eps = c.value("rms_norm_eps", 1e-6);
  d.rope_theta = c.value("rope_theta", 10000.0);
  d.tied = c.value("tie_word_embeddings", false);
  d.qk_norm = f.qk_norm;
  d.qkv_bias = f.qkv_bias;
  const std::string act = c.value("hidden_act", std::string("silu"));
  if (act != "silu") throw ckpt::CheckpointError(file + ": hidden_act '" + act + "': only silu (SwiGLU) is computed");
  if (c.contains("rope_scaling") && !c.at("rope_scaling").is_null()) {
    throw ckpt::CheckpointError(file + ": rope_scaling " + c.at("rope_scaling").dump() +
                                ": scaled rotary frequencies (Llama 3.1's, YaRN) are not computed here; only "
                                "plain rope_theta");
  }
  if (d.heads <= 0 || d.hidden % d.heads != 0)
    throw ckpt::CheckpointError(file + ": num_attention_heads does not divide hidden_size");
  if (c.contains("head_dim") && !c.at("head_dim").is_null() && c.at("head_dim").get<std::int64_t>() != d.head_dim()) {
    throw ckpt::CheckpointError(file + ": head_dim " + std::to_string(c.at("head_dim").get<std::int64_t>()) +
                                " differs from hidden_size / num_attention_heads = " + std::to_string(d.head_dim()) +
                                ": this project's attention has head width hidden / heads");
  }
  if (!f.moe) {
    d.ffn = need_int(c, "intermediate_size", file);
    return d;
  }
  if (std::string(f.model_type) == "mixtral") {
    d.experts = need_int(c, "num_local_experts", file);
    d.expert_ffn = need_int(c, "intermediate_size", file);
    d.renormalize = true;
  } else {
    d.experts = need_int(c, "num_experts", file);
    d.expert_ffn = need_int(c, "moe_intermediate_size", file);
    d.renormalize = c.value("norm_topk_prob", true);
    if (c.value("decoder_sparse_step", std::int64_t{1}) != 1 ||
        (c.contains("mlp_only_layers") && !c.at("mlp_only_layers").empty())) {
      throw ckpt::CheckpointError(file +
                                  ": experts on some layers only (decoder_sparse_step, mlp_only_layers) are not "
                                  "mapped; every layer must be a MoE layer");
    }
  }
  d.top_k = need_int(c, "num_experts_per_tok", file);
  d.ffn = d.expert_ffn;
  return d;
}

std::string model_yaml(const Dims& d) {
  std::ostringstream y;
  y << "# The model keys of the imported weights (hp-ckpt import --from-hf); model.seq_len is the\n"
       "# source's max_position_embeddings and free to change (rotary positions have no table).\n";
  y << "model:\n  type: llama\n  vocab_size: " << d.vocab << "\n  hidden: " << d.hidden << "\n  layers: " << d.layers
    << "\n  heads: " << d.heads << "\n  kv_heads: " << d.kv_heads << "\n  ffn_hidden: " << d.ffn
    << "\n  seq_len: " << d.seq << "\n  norm_eps: " << d.norm_eps << "\n  rope_theta: " << d.rope_theta
    << "\n  tie_embeddings: " << (d.tied ? "true" : "false") << "\n  qk_norm: " << (d.qk_norm ? "true" : "false")
    << "\n  qkv_bias: " << (d.qkv_bias ? "true" : "false") << "\n";
  if (d.experts > 0) {
    y << "  moe:\n    num_experts: " << d.experts << "\n    top_k: " << d.top_k << "\n    ffn_hidden: " << d.expert_ffn
      << "\n    score: softmax\n    renormalize: " << (d.renormalize ? "true" : "false") << "\n";
  }
  return y.str();
}

/// The HF weight files: model.safetensors, or the files a sharded index names.
std::map<std::string, std::string> hf_weight_files(const fs::path& dir) {
  std::map<std::string, std::string> where;  // tensor -> file
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    std::ifstream in(index);
    json j;
    try {
      j = json::parse(in);
    } catch (const std::exception& e) {
      throw ckpt::CheckpointError(index.string() + " is not JSON: " + e.what());
    }
    if (!j.contains("weight_map")) throw ckpt::CheckpointError(index.string() + " has no weight_map");
    for (const auto& [name, file] : j.at("weight_map").items()) where[name] = (dir / file.get<std::string>()).string();
    return where;
  }
  const fs::path single = dir / "model.safetensors";
  if (!fs::exists(single)) {
    throw UsageError(dir.string() + " holds neither model.safetensors nor model.safetensors.index.json");
  }
  const ckpt::SafetensorsReader r(single.string());
  for (const auto& name : r.names()) where[name] = single.string();
  return where;
}

}  // namespace

int run_import_hf(const std::string& dir, const std::string& root) {
  const fs::path cfg_file = fs::path(dir) / "config.json";
  std::ifstream cfg_in(cfg_file);
  if (!cfg_in) throw UsageError(cfg_file.string() + " is missing: --from-hf needs a Hugging Face model directory");
  json cfg;
  try {
    cfg = json::parse(cfg_in);
  } catch (const std::exception& e) {
    throw ckpt::CheckpointError(cfg_file.string() + " is not JSON: " + e.what());
  }
  const Family& f = family_named(cfg.value("model_type", std::string("(none)")));
  const Dims d = dims_from_hf(cfg, f, cfg_file.string());
  const auto entries = name_map(f, d);
  const auto where = hf_weight_files(dir);

  // Every name the family expects, at its shape; nothing else (rotary
  // tables some exports carry are derived, and skipped).
  std::map<std::string, bool> expected;
  for (const auto& e : entries) expected[e.hf] = true;
  for (const auto& [name, file] : where) {
    if (expected.count(name) || name.find("rotary_emb.inv_freq") != std::string::npos) continue;
    throw ckpt::CheckpointError(file + ": tensor '" + name + "' is not one the " + f.model_type +
                                " family has with these dimensions (first unexpected tensor)");
  }
  std::map<std::string, std::unique_ptr<ckpt::SafetensorsReader>> readers;
  auto read = [&](const Entry& e) {
    auto it = where.find(e.hf);
    if (it == where.end()) {
      throw ckpt::CheckpointError(dir + ": tensor '" + e.hf + "' of shape " + shape_text(e.shape) + " is missing (the " +
                                  f.model_type + " family with these dimensions has it)");
    }
    auto& r = readers[it->second];
    if (!r) r = std::make_unique<ckpt::SafetensorsReader>(it->second);
    const auto& entry = r->entry(e.hf);
    if (entry.shape != e.shape) {
      throw ckpt::CheckpointError(it->second + ": tensor '" + e.hf + "' has shape " + shape_text(entry.shape) +
                                  ", the " + f.model_type + " family with config.json's dimensions expects " +
                                  shape_text(e.shape));
    }
    return r->read(e.hf).to(at::kFloat);  // masters are fp32
  };
  // Stack experts in order; everything else as it is.
  std::map<std::string, std::vector<at::Tensor>> stacks;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& e : entries) {
    if (e.expert < 0) {
      tensors.emplace_back(e.hp, read(e).contiguous());
    } else {
      stacks[e.hp].push_back(read(e));
    }
  }
  for (auto& [name, parts] : stacks) tensors.emplace_back(name, at::stack(parts).contiguous());
  write_step_zero(root, tensors, {{"imported_from", fs::absolute(dir).string()}, {"hf_model_type", f.model_type}});
  const fs::path yaml = fs::path(root) / "model.yaml";
  std::ofstream(yaml) << model_yaml(d);
  std::printf("imported %s (%s, %zu tensors) as step 0 in %s; its model keys are in %s\n", dir.c_str(), f.model_type,
              tensors.size(), (fs::path(root) / ckpt::step_dir_name(0)).string().c_str(), yaml.string().c_str());
  return 0;
}

int run_export_hf(const std::string& dir, const std::string& out, const std::string& family) {
  const std::string step_dir = resolve_step_dir(dir);
  const ckpt::CheckpointReader reader(step_dir);
  if (reader.config_text().empty()) {
    throw UsageError(step_dir + " stores no config (written before configs were, or imported): the model keys the "
                                "export maps to config.json are unknown");
  }
  const YAML::Node m = YAML::Load(reader.config_text())["model"];
  if (!m || m["type"].as<std::string>() != "llama") {
    throw UsageError(step_dir + ": model.type " + (m ? m["type"].as<std::string>() : std::string("(none)")) +
                     ": only the llama kind maps to a Hugging Face family");
  }
  Dims d;
  d.vocab = m["vocab_size"].as<std::int64_t>();
  d.hidden = m["hidden"].as<std::int64_t>();
  d.layers = m["layers"].as<std::int64_t>();
  d.heads = m["heads"].as<std::int64_t>();
  d.kv_heads = m["kv_heads"].as<std::int64_t>() == 0 ? d.heads : m["kv_heads"].as<std::int64_t>();
  d.seq = m["seq_len"].as<std::int64_t>();
  d.norm_eps = m["norm_eps"].as<double>();
  d.rope_theta = m["rope_theta"].as<double>();
  d.tied = m["tie_embeddings"].as<bool>();
  d.qk_norm = m["qk_norm"].as<bool>();
  d.qkv_bias = m["qkv_bias"].as<bool>();
  const YAML::Node moe = m["moe"];
  const bool is_moe = moe && moe["num_experts"].as<std::int64_t>() > 0;
  // The ffn width the model used (0: Llama's rule).
  d.ffn = m["ffn_hidden"].as<std::int64_t>();
  if (d.ffn == 0) d.ffn = llama_ffn_width(d.hidden);
  if (is_moe) {
    d.experts = moe["num_experts"].as<std::int64_t>();
    d.top_k = moe["top_k"].as<std::int64_t>();
    d.expert_ffn = moe["ffn_hidden"].as<std::int64_t>() == 0 ? d.ffn : moe["ffn_hidden"].as<std::int64_t>();
    d.renormalize = moe["renormalize"].as<bool>();
    std::string why;
    if (moe["shared_experts"].as<std::int64_t>() > 0) why = "shared experts (no family here has them ungated)";
    else if (moe["every"].as<std::int64_t>() != 1) why = "experts on some layers only (model.moe.every > 1)";
    else if (moe["score"].as<std::string>() != "softmax") why = "sigmoid router scores";
    else if (moe["bias_update_rate"].as<double>() > 0) why = "an aux-loss-free router bias";
    if (!why.empty()) throw UsageError(step_dir + ": the model has " + why + ", which no mapped family holds");
  }
  const char* pick = family.empty() ? (is_moe ? (d.qk_norm ? "qwen3_moe" : "mixtral")
                                              : (d.qk_norm ? "qwen3" : d.qkv_bias ? "qwen2" : "llama"))
                                    : family.c_str();
  const Family& f = family_named(pick);
  if (f.moe != is_moe || f.qk_norm != d.qk_norm || f.qkv_bias != d.qkv_bias ||
      (std::string(f.model_type) == "mixtral" && !d.renormalize)) {
    throw UsageError(std::string("--family ") + pick + " does not hold this model (experts " + (is_moe ? "yes" : "no") +
                     ", qk_norm " + (d.qk_norm ? "yes" : "no") + ", qkv_bias " + (d.qkv_bias ? "yes" : "no") + ")");
  }
  require_fresh_output(out, "--to-hf");
  std::map<std::string, at::Tensor> full;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& e : name_map(f, d)) {
    auto it = full.find(e.hp);
    if (it == full.end()) {
      if (!reader.manifest().tensors.count(e.hp)) {
        throw ckpt::CheckpointError(step_dir + " lacks tensor '" + e.hp + "' (for " + e.hf + ")");
      }
      it = full.emplace(e.hp, reader.read_full(e.hp)).first;
    }
    at::Tensor t = e.expert < 0 ? it->second : it->second[e.expert];
    if (t.sizes().vec() != e.shape) {
      throw ckpt::CheckpointError(step_dir + ": tensor '" + e.hp + "' has shape " + shape_text(t.sizes().vec()) +
                                  ", " + e.hf + " needs " + shape_text(e.shape));
    }
    tensors.emplace_back(e.hf, t.contiguous());
  }
  fs::create_directories(out);
  ckpt::write_safetensors((fs::path(out) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  json c = {{"architectures", {f.architecture}},
            {"model_type", f.model_type},
            {"vocab_size", d.vocab},
            {"hidden_size", d.hidden},
            {"num_hidden_layers", d.layers},
            {"num_attention_heads", d.heads},
            {"num_key_value_heads", d.kv_heads},
            {"head_dim", d.head_dim()},
            {"max_position_embeddings", d.seq},
            {"rms_norm_eps", d.norm_eps},
            {"rope_theta", d.rope_theta},
            {"rope_scaling", nullptr},
            {"tie_word_embeddings", d.tied},
            {"hidden_act", "silu"},
            {"attention_bias", d.qkv_bias},
            {"torch_dtype", "float32"},
            {"intermediate_size", d.ffn}};
  if (std::string(f.model_type) == "mixtral") {
    c["num_local_experts"] = d.experts;
    c["num_experts_per_tok"] = d.top_k;
    c["intermediate_size"] = d.expert_ffn;
  } else if (f.moe) {
    c["num_experts"] = d.experts;
    c["num_experts_per_tok"] = d.top_k;
    c["moe_intermediate_size"] = d.expert_ffn;
    c["norm_topk_prob"] = d.renormalize;
    c["decoder_sparse_step"] = 1;
    c["mlp_only_layers"] = json::array();
  }
  std::ofstream(fs::path(out) / "config.json") << c.dump(2) << "\n";
  std::printf("exported step %lld as %s (%zu tensors) into %s\n", static_cast<long long>(reader.step()),
              f.model_type, tensors.size(), out.c_str());
  return 0;
}

}  // namespace hp::ckpt_tool
