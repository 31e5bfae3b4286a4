#include "hp/data/dataset.h"

#include <cmath>
#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "hp/config/config.h"
#include "hp/config/errors.h"
#include "framework/data/registry.h"
#include "hp/model/model_info.h"
#include "hp/profile/trace.h"

namespace fs = std::filesystem;

namespace hp {

std::uint64_t mix(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t d) {
  std::uint64_t z = 0x9e3779b97f4a7c15ULL;
  for (std::uint64_t w : {a, b, c, d}) {
    z ^= w + 0x9e3779b97f4a7c15ULL + (z << 6) + (z >> 2);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
  }
  return z;
}

Batch make_batch(const Dataset& ds, Split split, std::int64_t step, std::int64_t first,
                 std::int64_t count, std::int64_t seq) {
  // The loader's share of a step, on the trace beside forward and backward.
  profile::Span span("data", "batch");
  span.arg("samples", count);
  return ds.make(split, step, first, count, seq);
}

Batch TokenDataset::make(Split split, std::int64_t step, std::int64_t first, std::int64_t count,
                         std::int64_t seq) const {
  at::Tensor tokens = at::empty({count, seq}, at::kLong);
  at::Tensor labels = at::empty({count, seq}, at::kLong);
  auto* t = tokens.data_ptr<std::int64_t>();
  auto* y = labels.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < count; ++i) sample(split, step, first + i, t + i * seq, y + i * seq, seq);
  return Batch{make_activations({{"tokens", tokens}}), make_activations({{"labels", labels}})};
}

namespace {

bool looks_binary(const std::string& bytes) {
  const std::size_t n = std::min<std::size_t>(bytes.size(), 4096);
  for (std::size_t i = 0; i < n; ++i) {
    if (bytes[i] == '\0') return true;
  }
  return false;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class TextDataset : public TokenDataset {
 public:
  TextDataset(const std::string& path, std::int64_t seq, double valid_fraction, std::uint64_t seed)
      : seed_(seed) {
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      throw std::runtime_error("data.path = " + path + ": the corpus does not exist");
    }
    std::vector<fs::path> files;
    if (fs::is_directory(path, ec)) {
      for (const auto& e : fs::recursive_directory_iterator(path, ec)) {
        if (e.is_symlink() || !e.is_regular_file()) continue;
        if (e.path().extension() == ".dat") continue;  // fortune's binary index files
        files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());
    } else {
      files.push_back(path);
    }
    for (const auto& f : files) {
      std::string bytes = read_all(f);
      if (looks_binary(bytes)) continue;
      text_ += bytes;
      ++files_used_;
    }
    if (text_.empty()) {
      throw std::runtime_error("data.path = " + path + ": the corpus is empty (no text files" +
                               (files.empty() ? "" : " among " + std::to_string(files.size()) +
                                                         " files") + ")");
    }
    const auto n = static_cast<std::int64_t>(text_.size());
    valid_begin_ = static_cast<std::int64_t>(static_cast<double>(n) * (1.0 - valid_fraction));
    const std::int64_t need = seq + 1;
    if (valid_begin_ < need || (valid_fraction > 0 && n - valid_begin_ < need)) {
      throw std::runtime_error("data.path = " + path + ": the corpus has " + std::to_string(n) +
                               " bytes, too few for one sample of " + std::to_string(need) +
                               " bytes in each split");
    }
    path_ = path;
  }

  void sample(Split split, std::int64_t step, std::int64_t index, std::int64_t* tokens,
              std::int64_t* targets, std::int64_t seq) const override {
    const bool train = split == Split::kTrain || valid_begin_ == static_cast<std::int64_t>(text_.size());
    const std::int64_t begin = train ? 0 : valid_begin_;
    const std::int64_t end = train ? valid_begin_ : static_cast<std::int64_t>(text_.size());
    const std::uint64_t span = static_cast<std::uint64_t>(end - begin - seq - 1) + 1;
    const std::int64_t start =
        begin + static_cast<std::int64_t>(mix(seed_, train ? 1 : 2, static_cast<std::uint64_t>(step),
                                              static_cast<std::uint64_t>(index)) % span);
    const auto* p = reinterpret_cast<const unsigned char*>(text_.data()) + start;
    for (std::int64_t i = 0; i < seq; ++i) {
      tokens[i] = p[i];
      targets[i] = p[i + 1];
    }
  }

  std::string describe() const override {
    return "text corpus " + path_ + ": " + std::to_string(files_used_) + " files, " +
           std::to_string(text_.size()) + " bytes (" + std::to_string(valid_begin_) +
           " train, " + std::to_string(text_.size() - static_cast<std::size_t>(valid_begin_)) +
           " valid)";
  }

 private:
  std::uint64_t seed_;
  std::string text_;
  std::string path_;
  std::int64_t valid_begin_ = 0;
  int files_used_ = 0;
};

class SyntheticDataset : public TokenDataset {
 public:
  SyntheticDataset(std::int64_t vocab, std::uint64_t seed) : vocab_(vocab), seed_(seed) {
    a_ = static_cast<std::int64_t>(mix(seed, 11) % static_cast<std::uint64_t>(vocab - 1)) + 1;
    c_ = static_cast<std::int64_t>(mix(seed, 12) % static_cast<std::uint64_t>(vocab));
  }
  void sample(Split split, std::int64_t step, std::int64_t index, std::int64_t* tokens,
              std::int64_t* targets, std::int64_t seq) const override {
    std::int64_t x = static_cast<std::int64_t>(
        mix(seed_, split == Split::kTrain ? 3 : 4, static_cast<std::uint64_t>(step),
            static_cast<std::uint64_t>(index)) %
        static_cast<std::uint64_t>(vocab_));
    for (std::int64_t i = 0; i < seq; ++i) {
      tokens[i] = x;
      x = (a_ * x + c_) % vocab_;
      targets[i] = x;
    }
  }
  std::string describe() const override {
    return "synthetic: x[i+1] = (" + std::to_string(a_) + " * x[i] + " + std::to_string(c_) +
           ") mod " + std::to_string(vocab_);
  }

 private:
  std::int64_t vocab_;
  std::uint64_t seed_;
  std::int64_t a_ = 1, c_ = 0;
};

}  // namespace

std::shared_ptr<Dataset> make_text_dataset(const std::string& path, std::int64_t seq,
                                           double valid_fraction, std::uint64_t seed) {
  return std::make_shared<TextDataset>(path, seq, valid_fraction, seed);
}

std::shared_ptr<Dataset> make_synthetic_dataset(std::int64_t vocab, std::uint64_t seed) {
  return std::make_shared<SyntheticDataset>(vocab, seed);
}

namespace {

class FieldDataset : public Dataset {
 public:
  FieldDataset(std::int64_t channels, std::uint64_t seed) : channels_(channels), seed_(seed) {}

  Batch make(Split split, std::int64_t step, std::int64_t first, std::int64_t count,
             std::int64_t seq) const override {
    const std::int64_t C = channels_;
    at::Tensor field = at::empty({count, seq, C}, at::kFloat);
    at::Tensor target = at::empty({count, seq, C}, at::kFloat);
    auto* x = field.data_ptr<float>();
    auto* y = target.data_ptr<float>();
    const double two_pi = 6.283185307179586;
    for (std::int64_t i = 0; i < count; ++i) {
      const auto h = mix(seed_, split == Split::kTrain ? 3 : 4, static_cast<std::uint64_t>(step),
                         static_cast<std::uint64_t>(first + i));
      float* xi = x + i * seq * C;
      for (std::int64_t c = 0; c < C; ++c) {
        double phase[3];
        for (int k = 0; k < 3; ++k) {
          phase[k] = two_pi * static_cast<double>(mix(h, static_cast<std::uint64_t>(c), static_cast<std::uint64_t>(k)) % 10007) / 10007.0;
        }
        for (std::int64_t l = 0; l < seq; ++l) {
          double v = 0;
          for (int k = 0; k < 3; ++k) {
            v += std::sin(two_pi * (k + 1) * static_cast<double>(l) / static_cast<double>(seq) + phase[k]) / (k + 1);
          }
          xi[l * C + c] = static_cast<float>(v);
        }
      }
      float* yi = y + i * seq * C;
      for (std::int64_t l = 0; l < seq; ++l) {
        const std::int64_t prev = (l + seq - 1) % seq, next = (l + 1) % seq;
        for (std::int64_t c = 0; c < C; ++c) {
          yi[l * C + c] = static_cast<float>(
              std::tanh(0.5 * xi[prev * C + c] + 0.5 * xi[next * C + (c + 1) % C] - 0.25 * xi[l * C + c]));
        }
      }
    }
    return Batch{make_activations({{"field", field}}), make_activations({{"field", target}})};
  }

  std::string describe() const override {
    return "field: " + std::to_string(channels_) +
           " channels of sums of sines; target tanh(0.5 x[l-1, c] + 0.5 x[l+1, c+1] - 0.25 x[l, c])";
  }

 private:
  std::int64_t channels_;
  std::uint64_t seed_;
};

}  // namespace

std::shared_ptr<Dataset> make_field_dataset(std::int64_t channels, std::uint64_t seed) {
  return std::make_shared<FieldDataset>(channels, seed);
}

namespace {

void register_builtin_datasets(DatasetRegistry& r) {
  r.add({"text", "byte tokens from a file or a directory of text files (data.path)", {"tokens"}, 256,
         [](const Config& c, ConfigErrors& e) {
           if (!c.ok({"data.path"})) return;
           const auto& p = c.get_string("data.path");
           std::error_code ec;
           if (!fs::exists(p, ec)) {
             e.add("data.path", p, "does not exist",
                   "a text file or a directory of text files (Debian's 'fortunes' package provides "
                   "/usr/share/games/fortunes)");
           }
         },
         [](const Config& c) -> std::shared_ptr<Dataset> {
           return make_text_dataset(c.get_string("data.path"), c.get_int("model.seq_len"),
                                    c.get_float("data.valid_fraction"), static_cast<std::uint64_t>(c.get_int("run.seed")));
         }});
  r.add({"synthetic", "a generated learnable task over model.vocab_size tokens", {"tokens"}, 0, nullptr,
         [](const Config& c) -> std::shared_ptr<Dataset> {
           return make_synthetic_dataset(c.get_int("model.vocab_size"), static_cast<std::uint64_t>(c.get_int("run.seed")));
         }});
  r.add({"field", "a generated field-regression task of model.channels channels", {"field"}, 0, nullptr,
         [](const Config& c) -> std::shared_ptr<Dataset> {
           return make_field_dataset(c.get_int("model.channels"), static_cast<std::uint64_t>(c.get_int("run.seed")));
         }});
}

}  // namespace

DatasetRegistry& datasets() {
  static DatasetRegistry* r = [] {
    auto* reg = new DatasetRegistry("dataset");
    register_builtin_datasets(*reg);
    register_tokens_dataset(*reg);
    return reg;
  }();
  return *r;
}

void check_data_against_model(const Config& c, const ModelInfo& model, ConfigErrors& e) {
  if (!c.ok({"data.type"})) return;
  const DatasetEntry* d = datasets().find(c.get_string("data.type"));
  if (!d) return;  // the enum check reported it
  if (d->validate) d->validate(c, e);
  if (c.ok({"data.document_attention"}) && c.get_bool("data.document_attention")) {
    std::string legal;
    for (const auto& other : datasets().entries()) {
      if (other.has_documents) legal += (legal.empty() ? "" : ", ") + other.name;
    }
    if (!d->has_documents) {
      e.add("data.document_attention", "true", "data.type " + d->name + " has no documents to keep attention inside",
            "false, or data.type " + legal);
    } else if (!model.layer_kinds.count("attention.heads")) {
      e.add("data.document_attention", "true", "model '" + model.name + "' has no attention", "false");
    }
  }
  for (const auto& input : model.inputs) {
    if (std::find(d->inputs.begin(), d->inputs.end(), input) != d->inputs.end()) continue;
    std::string legal;
    for (const auto& other : datasets().entries()) {
      if (std::find(other.inputs.begin(), other.inputs.end(), input) != other.inputs.end()) {
        legal += (legal.empty() ? "" : ", ") + other.name;
      }
    }
    e.add("data.type", d->name,
          "model '" + model.name + "' reads input '" + input + "', which this dataset does not produce",
          legal.empty() ? "a dataset producing '" + input + "'" : legal);
  }
  if (const SplitSize* vocab = model.size("vocab");
      vocab && d->token_range > 0 && c.ok({vocab->key.c_str()}) && vocab->value < d->token_range) {
    e.add(vocab->key, std::to_string(vocab->value),
          "is below " + std::to_string(d->token_range) + ", but data.type " + d->name + " yields tokens 0.." +
              std::to_string(d->token_range - 1),
          ">= " + std::to_string(d->token_range));
  }
}

void complete_data_options(RawConfig& raw) {
  for (const auto& d : datasets().entries()) {
    if (d.complete) d.complete(raw);
  }
}

std::shared_ptr<Dataset> make_dataset(const Config& c) {
  return datasets().get(c.get_string("data.type")).make(c);
}

}  // namespace hp
