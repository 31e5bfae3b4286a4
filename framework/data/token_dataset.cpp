// `data.type: tokens`: prepared corpora read by memory map.
//
// A corpus is one stream of tokens (its shards in order, an end-of-document
// token after every document). The last `data.valid_fraction` of its
// documents is the validation split, so both splits are contiguous ranges
// of the stream. A sample is seq + 1 consecutive tokens starting at a
// position drawn from (seed, split, step, sample index), as the text corpus
// draws them: every layout and every resume reads the same sequences. With
// `data.blend` each sample's corpus is chosen by Megatron's deterministic
// rule over the global sample number step x global batch + index.
#include <yaml-cpp/yaml.h>

#include <ATen/ATen.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <stdexcept>

#include "framework/data/registry.h"
#include "hp/config/config.h"
#include "hp/config/errors.h"
#include "hp/data/dataset.h"
#include "hp/data/token_shards.h"
#include "hp/data/tokenizer.h"
#include "hp/data/tokens.h"

namespace fs = std::filesystem;

namespace hp {

namespace {
constexpr const char* kBlendKey = "data.blend";
constexpr const char* kBlendLegal = "a list of {path: DIR, weight: W > 0}, e.g. [{path: a, weight: 0.3}, {path: b, weight: 0.7}]";
}  // namespace

std::unique_ptr<Tokenizer> run_tokenizer(const Config& c) {
  const std::string kind = c.get_string("data.type");
  if (kind == "text") return make_byte_tokenizer();
  if (kind != "tokens")
    throw std::invalid_argument("data.type " + kind + " has no tokenizer: generation needs data.type text or tokens");
  if (!c.get_string("data.tokenizer").empty()) return load_tokenizer(c.get_string("data.tokenizer"));
  std::string dir = c.get_string("data.path");
  const auto& blend = c.get_string_list("data.blend");
  if (!blend.empty()) dir = parse_data_blend(blend, nullptr).front().path;
  const TokenManifest m = read_token_manifest(dir);
  if (m.tokenizer_file == "bytes") return make_byte_tokenizer();
  const std::string file = (std::filesystem::path(dir) / m.tokenizer_file).string();
  std::error_code ec;
  if (!std::filesystem::exists(file, ec))
    throw std::invalid_argument("the tokenizer the checkpoint was trained with, " + file +
                                ", is missing (give data.tokenizer with --set)");
  return load_tokenizer(file);
}

std::vector<BlendSource> parse_data_blend(const std::vector<std::string>& items, ConfigErrors* errors) {
  std::vector<BlendSource> out;
  const auto bad = [&](const std::string& item, const std::string& rule) {
    if (errors) {
      errors->add(kBlendKey, item, rule, kBlendLegal);
      return;
    }
    throw ConfigException(kBlendKey, item, rule, kBlendLegal);
  };
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::string where = "item " + std::to_string(i);
    YAML::Node node;
    try {
      node = YAML::Load(items[i]);
    } catch (const std::exception&) {
      bad(items[i], where + " is not a mapping");
      continue;
    }
    if (!node.IsMap()) {
      bad(items[i], where + " is not a mapping");
      continue;
    }
    BlendSource s;
    bool ok = true, has_path = false;
    for (const auto& kv : node) {
      const auto key = kv.first.as<std::string>();
      try {
        if (key == "path") {
          s.path = kv.second.as<std::string>();
          has_path = true;
        } else if (key == "weight") {
          s.weight = kv.second.as<double>();
          if (!(s.weight > 0) || !std::isfinite(s.weight)) {
            bad(items[i], where + ": weight must be a finite number > 0");
            ok = false;
          }
        } else {
          bad(items[i], where + ": unknown key '" + key + "' (path, weight)");
          ok = false;
        }
      } catch (const YAML::Exception&) {
        bad(items[i], where + ": '" + key + "' has the wrong type");
        ok = false;
      }
    }
    if (!has_path) {
      bad(items[i], where + " has no path");
      ok = false;
    }
    if (ok) out.push_back(s);
  }
  return out;
}

BlendRule::BlendRule(std::vector<double> weights) : weights_(std::move(weights)) {
  double total = 0;
  for (double w : weights_) total += w;
  for (double& w : weights_) w /= total;
  count_.assign(weights_.size(), 0);
}

std::uint16_t BlendRule::source(std::int64_t i) const {
  std::lock_guard<std::mutex> g(mu_);
  while (static_cast<std::int64_t>(index_.size()) <= i) {
    const double s = std::max(static_cast<double>(index_.size()), 1.0);
    std::size_t best = 0;
    double best_err = weights_[0] * s - static_cast<double>(count_[0]);
    for (std::size_t d = 1; d < weights_.size(); ++d) {
      const double err = weights_[d] * s - static_cast<double>(count_[d]);
      if (err > best_err) {
        best_err = err;
        best = d;
      }
    }
    index_.push_back(static_cast<std::uint16_t>(best));
    ++count_[best];
  }
  return index_[static_cast<std::size_t>(i)];
}

namespace {

std::vector<BlendSource> sources_of(const Config& c) {
  const auto& items = c.get_string_list(kBlendKey);
  if (!items.empty()) return parse_data_blend(items, nullptr);
  return {{c.get_string("data.path"), 1.0}};
}

struct SplitRange {
  std::int64_t begin = 0, end = 0;  ///< stream positions
};

// The train and validation token ranges of a corpus (by documents).
std::pair<SplitRange, SplitRange> split_ranges(const TokenCorpus& c, double valid_fraction) {
  const std::int64_t docs = c.documents();
  std::int64_t valid_docs = static_cast<std::int64_t>(std::llround(static_cast<double>(docs) * valid_fraction));
  if (valid_fraction > 0 && valid_docs == 0 && docs >= 2) valid_docs = 1;
  const std::int64_t cut = c.document_start(docs - valid_docs);
  return {{0, cut}, {cut, c.tokens()}};
}

class TokensDataset : public TokenDataset {
 public:
  TokensDataset(const std::vector<BlendSource>& sources, double valid_fraction, std::uint64_t seed,
                std::int64_t global_batch, std::int64_t seq)
      : seed_(seed), global_batch_(global_batch) {
    std::vector<double> weights;
    for (const auto& s : sources) {
      Source src;
      src.corpus = std::make_unique<TokenCorpus>(s.path);
      std::tie(src.train, src.valid) = split_ranges(*src.corpus, valid_fraction);
      if (src.train.end - src.train.begin < seq + 1)
        throw std::runtime_error("data.path = " + s.path + ": the training split has " +
                                 std::to_string(src.train.end - src.train.begin) + " tokens, too few for one sample of " +
                                 std::to_string(seq + 1));
      if (src.valid.end - src.valid.begin < seq + 1) src.valid = src.train;  // too small: validate on train
      weights.push_back(s.weight);
      blend_weights_.push_back(s.weight);
      sources_.push_back(std::move(src));
    }
    if (sources_.size() > 1) blend_ = std::make_unique<BlendRule>(weights);
  }

  void sample(Split split, std::int64_t step, std::int64_t index, std::int64_t* tokens, std::int64_t* targets,
              std::int64_t seq) const override {
    const auto [s, start] = locate(split, step, index, seq);
    thread_local std::vector<std::int64_t> buf;
    buf.resize(static_cast<std::size_t>(seq + 1));
    s->corpus->read(start, seq + 1, buf.data());
    for (std::int64_t i = 0; i < seq; ++i) {
      tokens[i] = buf[i];
      targets[i] = buf[i + 1];
    }
  }

  at::Tensor documents(Split split, std::int64_t step, std::int64_t first, std::int64_t count,
                       std::int64_t seq) const override {
    at::Tensor out = at::empty({count, seq}, at::kLong);
    auto* p = out.data_ptr<std::int64_t>();
    for (std::int64_t i = 0; i < count; ++i) {
      const auto [s, start] = locate(split, step, first + i, seq);
      // Walk the document boundaries from the sample's first position.
      std::int64_t doc = s->corpus->document_of(start), next = s->corpus->document_start(doc + 1), n = 0;
      for (std::int64_t t = 0; t < seq; ++t) {
        while (start + t >= next) {
          ++n;
          next = s->corpus->document_start(++doc + 1);
        }
        p[i * seq + t] = n;
      }
    }
    return out;
  }

  std::string describe() const override {
    std::string out = "tokens:";
    for (std::size_t d = 0; d < sources_.size(); ++d) {
      const auto& s = sources_[d];
      const auto& m = s.corpus->manifest();
      out += (d ? "; " : " ") + s.corpus->dir() + " (" + std::to_string(s.corpus->documents()) + " documents, " +
             std::to_string(s.corpus->tokens()) + " tokens: " + std::to_string(s.train.end - s.train.begin) +
             " train, " + std::to_string(s.valid.end - s.valid.begin) + " valid; " + m.tokenizer_kind + " " +
             m.tokenizer_hash + ")";
    }
    return out;
  }

 private:
  struct Source {
    std::unique_ptr<TokenCorpus> corpus;
    SplitRange train, valid;
  };
  // The corpus and stream position of sample `index` of `step`.
  std::pair<const Source*, std::int64_t> locate(Split split, std::int64_t step, std::int64_t index,
                                                       std::int64_t seq) const {
    const bool train = split == Split::kTrain;
    std::size_t d = 0;
    if (blend_) {
      auto& rule = train ? *blend_ : valid_blend();
      d = rule.source(step * global_batch_ + index);
    }
    const Source& s = sources_[d];
    const SplitRange r = train ? s.train : s.valid;
    const std::uint64_t span = static_cast<std::uint64_t>(r.end - r.begin - seq - 1) + 1;
    const std::uint64_t salt = blend_ ? mix(seed_, 0x626c656e64ULL, d) : seed_;  // per-corpus draws in a blend
    return {&s, r.begin + static_cast<std::int64_t>(mix(salt, train ? 1 : 2, static_cast<std::uint64_t>(step),
                                                        static_cast<std::uint64_t>(index)) % span)};
  }
  const BlendRule& valid_blend() const {
    std::call_once(valid_once_, [&] {
      std::vector<double> w;
      for (std::size_t d = 0; d < sources_.size(); ++d) w.push_back(blend_weights_[d]);
      valid_blend_ = std::make_unique<BlendRule>(w);
    });
    return *valid_blend_;
  }
  std::uint64_t seed_;
  std::int64_t global_batch_;
  std::vector<Source> sources_;
  std::unique_ptr<BlendRule> blend_;
  std::vector<double> blend_weights_;
  mutable std::once_flag valid_once_;
  mutable std::unique_ptr<BlendRule> valid_blend_;
};

void validate_tokens(const Config& c, ConfigErrors& e) {
  if (!c.ok({"data.path", kBlendKey, "data.tokenizer", "data.valid_fraction"})) return;
  const bool blended = !c.get_string_list(kBlendKey).empty();
  std::vector<BlendSource> sources;
  if (blended) {
    const std::size_t before = e.size();
    sources = parse_data_blend(c.get_string_list(kBlendKey), &e);
    if (e.size() != before) return;
    if (sources.size() > 32767) e.add(kBlendKey, std::to_string(sources.size()) + " items", "has too many corpora", "<= 32767");
  } else {
    sources = {{c.get_string("data.path"), 1.0}};
  }
  const std::string key = blended ? kBlendKey : "data.path";
  std::string first_hash, first_path;
  std::int64_t vocab = 0;
  for (const auto& s : sources) {
    const auto problems = check_token_dir(s.path, /*checksums=*/true);
    if (!problems.empty()) {
      for (const auto& p : problems)
        e.add(key, s.path, p, "a directory made by hp-data prepare, whole (delete a damaged shard's .json and rerun the same hp-data prepare to make it again)");
      continue;
    }
    const TokenManifest m = read_token_manifest(s.path);
    vocab = std::max(vocab, m.vocab_size);
    if (first_hash.empty()) {
      first_hash = m.tokenizer_hash;
      first_path = s.path;
    } else if (m.tokenizer_hash != first_hash) {
      e.add(key, s.path,
            "was tokenized with " + m.tokenizer_hash + " but " + first_path + " with " + first_hash +
                "; a blend reads one tokenizer",
            "corpora prepared with the same tokenizer");
    }
    const std::string& want = c.get_string("data.tokenizer");
    if (!want.empty()) {
      std::string h;
      try {
        h = tokenizer_hash(want);
      } catch (const std::exception& ex) {
        e.add("data.tokenizer", want, ex.what(), "a tokenizer.json, a SentencePiece .model, or bytes");
        continue;
      }
      if (h != m.tokenizer_hash)
        e.add("data.tokenizer", want,
              "has hash " + h + " but the shards of " + s.path + " were made with " + m.tokenizer_hash,
              "the tokenizer the corpus was prepared with (" + s.path + "/" + m.tokenizer_file + "), or leave data.tokenizer empty");
    }
  }
  if (vocab > 0 && c.ok({"model.vocab_size"}) && c.has("model.vocab_size") && c.get_int("model.vocab_size") < vocab) {
    e.add("model.vocab_size", std::to_string(c.get_int("model.vocab_size")),
          "is below the tokenizer's vocabulary of " + std::to_string(vocab) + " (data.type tokens)",
          ">= " + std::to_string(vocab) + ", or leave it unset to take the tokenizer's");
  }
}

}  // namespace

void register_tokens_dataset(DatasetRegistry& r) {
  DatasetEntry d;
  d.name = "tokens";
  d.doc = "token shards made by hp-data prepare (data.path, or data.blend), read by memory map";
  d.inputs = {"tokens"};
  d.token_range = 0;  // the corpus's vocabulary, checked by validate
  d.has_documents = true;
  d.validate = validate_tokens;
  d.complete = [](RawConfig& raw) {
    const RawEntry* type = raw.find("data.type");
    if (!type || type->shown() != "tokens" || raw.find("model.vocab_size")) return;
    std::string dir;
    if (const RawEntry* blend = raw.find(kBlendKey); blend && !blend->items.empty()) {
      try {
        dir = parse_data_blend(blend->items, nullptr).at(0).path;
      } catch (const std::exception&) {
        return;  // validate reports it
      }
    } else if (const RawEntry* p = raw.find("data.path")) {
      dir = p->shown();
    }
    try {
      raw.set("model.vocab_size", std::to_string(read_token_manifest(dir).vocab_size));
    } catch (const std::exception&) {
      // validate reports a missing or damaged corpus
    }
  };
  d.make = [](const Config& c) -> std::shared_ptr<Dataset> {
    return std::make_shared<TokensDataset>(sources_of(c), c.get_float("data.valid_fraction"),
                                           static_cast<std::uint64_t>(c.get_int("run.seed")),
                                           c.get_int("training.global_batch_size"), c.get_int("model.seq_len"));
  };
  r.add(std::move(d));
}

}  // namespace hp
