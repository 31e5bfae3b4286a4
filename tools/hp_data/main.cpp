// hp-data: make and look at prepared corpora (token shards) and tokenizers.
// Exit codes: 0 success, 1 a failure (one line naming the file and cause),
// 2 a usage error or a refused config.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <iostream>
#include <thread>

#include "hp/config/config.h"
#include "hp/config/errors.h"
#include "hp/data/token_shards.h"
#include "hp/data/tokenizer.h"
#include "tools/exit_now.h"
#include "tools/hp_data/hp_data.h"

namespace fs = std::filesystem;

namespace {

std::string printable(const std::string& s, std::size_t max) {
  std::string out;
  for (unsigned char c : s.substr(0, max)) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + (s.size() > max ? "..." : "");
}

int inspect(const std::string& dir, int samples, std::int64_t sample_tokens, bool checksums) {
  const auto problems = hp::check_token_dir(dir, checksums);
  for (const auto& p : problems) std::cerr << "hp-data inspect: " << p << "\n";
  if (!problems.empty()) return 1;
  hp::TokenCorpus corpus(dir);
  const auto& m = corpus.manifest();
  std::printf("corpus      %s\n", dir.c_str());
  std::printf("tokenizer   %s %s (vocabulary %lld, end of document %d, file %s)\n", m.tokenizer_kind.c_str(),
              m.tokenizer_hash.c_str(), static_cast<long long>(m.vocab_size), m.eos_id, m.tokenizer_file.c_str());
  std::printf("tokens      %lld (%s), %lld documents, %zu shards, %.1f MB of text, %.3f tokens/byte\n",
              static_cast<long long>(m.tokens), m.token_bytes == 2 ? "uint16" : "uint32",
              static_cast<long long>(m.documents), m.shards.size(), static_cast<double>(m.input_bytes) / 1e6,
              m.input_bytes ? static_cast<double>(m.tokens) / static_cast<double>(m.input_bytes) : 0.0);
  std::printf("checksums   %s\n", checksums ? "every shard matches its xxh64" : "not checked (--no-checksums)");
  {
    const std::string file = m.tokenizer_file == "bytes" ? "bytes" : (fs::path(dir) / m.tokenizer_file).string();
    std::string specials;
    for (const auto& [name, id] : hp::load_tokenizer(file)->special_tokens())
      specials += (specials.empty() ? "" : ", ") + name + " " + std::to_string(id);
    std::printf("special     %s\n", specials.empty() ? "(none)" : specials.c_str());
  }
  for (const auto& s : m.shards)
    std::printf("  %s  %lld documents  %lld tokens  bin %s  idx %s\n", s.name.c_str(),
                static_cast<long long>(s.documents), static_cast<long long>(s.tokens), s.bin_xxh64.c_str(),
                s.idx_xxh64.c_str());
  if (samples > 0 && corpus.documents() > 0) {
    std::unique_ptr<hp::Tokenizer> tok;
    const std::string file = m.tokenizer_file == "bytes" ? "bytes" : (fs::path(dir) / m.tokenizer_file).string();
    tok = hp::load_tokenizer(file);
    for (int k = 0; k < samples; ++k) {
      const std::int64_t d = corpus.documents() * k / samples;
      const std::int64_t a = corpus.document_start(d), b = corpus.document_start(d + 1);
      const std::int64_t n = std::min(b - a, sample_tokens);
      std::vector<std::int64_t> ids(static_cast<std::size_t>(n));
      corpus.read(a, n, ids.data());
      std::vector<std::int32_t> ids32(ids.begin(), ids.end());
      std::printf("document %lld (%lld tokens): %s\n", static_cast<long long>(d), static_cast<long long>(b - a),
                  printable(tok->decode(ids32), 240).c_str());
      std::string shown;
      for (std::size_t i = 0; i < std::min<std::size_t>(ids.size(), 16); ++i)
        shown += (i ? " " : "") + std::to_string(ids[i]);
      std::printf("  ids: %s%s\n", shown.c_str(), ids.size() > 16 ? " ..." : "");
    }
  }
  return 0;
}

int run(int argc, char** argv) {
  namespace tool = hp::data_tool;
  CLI::App app{
      "hp-data: tokenize corpora into memory-mapped token shards (data.type: tokens), look at them, and train "
      "tokenizers.\nExit codes: 0 success, 1 failure, 2 usage error."};
  app.require_subcommand(1);
  tool::Options o;
  o.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  auto* prep = app.add_subcommand(
      "prepare",
      "Tokenize text files, directories (every text file, sorted by name) and JSON Lines (.jsonl) into shards; "
      "an end-of-document token after every document. Resumable: the same command continues an interrupted run.");
  std::string prep_config;
  std::vector<std::string> prep_sets;
  prep->add_option("--config", prep_config,
                   "A training config: its data.prepare.* options and data.path (the output) give the defaults "
                   "(a SentencePiece model trained first when data.prepare.train_vocab_size > 0 and it is absent)");
  prep->add_option("--set", prep_sets, "KEY=VALUE override of the config (repeatable), as hp-train");
  prep->add_option("--input", o.inputs, "Text file, directory or .jsonl file (repeatable)");
  prep->add_option("--tokenizer", o.tokenizer, "A tokenizer.json (byte-level BPE), a SentencePiece .model, or 'bytes'");
  prep->add_option("--out", o.out, "Output directory");
  prep->add_option("--text-field", o.text_field, "The JSON Lines field holding the text")->capture_default_str();
  prep->add_option("--split-on", o.split_on,
                   "In text files, a line equal to this ends a document (fortune files: %); default: one document "
                   "per file");
  prep->add_option("--shard-mb", o.shard_mb, "Text per shard, MB (shards are cut at document boundaries)")
      ->capture_default_str();
  prep->add_option("--threads", o.threads, "Worker threads (default: every core)")->capture_default_str();
  prep->add_option("--stop-after-shards", o.stop_after_shards,
                   "Stop after this many new shards (the same command continues later)");

  std::string dir, config_file;
  std::vector<std::string> sets;
  int samples = 3;
  std::int64_t sample_tokens = 64;
  bool no_checksums = false;
  auto* insp = app.add_subcommand(
      "inspect",
      "Counts, tokenizer, shard checksums and decoded samples of a prepared corpus; with --config, of the "
      "corpora a training config reads (data.path, or each of data.blend)");
  insp->add_option("dir", dir, "Prepared directory");
  insp->add_option("--config", config_file, "A training config (its data.path / data.blend are inspected)");
  insp->add_option("--set", sets, "KEY=VALUE override of the config (repeatable), as hp-train");
  insp->add_option("--samples", samples, "Documents decoded")->capture_default_str();
  insp->add_option("--sample-tokens", sample_tokens, "Tokens decoded per document")->capture_default_str();
  insp->add_flag("--no-checksums", no_checksums, "Skip the xxh64 of every shard");

  hp::SentencePieceTraining train;
  std::string kind = "sentencepiece", train_out;
  auto* tt = app.add_subcommand("train-tokenizer",
                                "Train a SentencePiece model on text files (one sentence per line); byte fallback on, "
                                "piece 0 <unk>, piece 1 </s> (end of document), no BOS");
  tt->add_option("--input", train.inputs, "Text file or directory (repeatable)")->required();
  tt->add_option("--kind", kind, "Tokenizer kind")->check(CLI::IsMember({"sentencepiece"}))->capture_default_str();
  tt->add_option("--vocab-size", train.vocab_size, "Vocabulary size")->required()->check(CLI::Range(8, 1 << 24));
  tt->add_option("--model-type", train.model_type, "unigram or bpe")
      ->check(CLI::IsMember({"unigram", "bpe"}))->capture_default_str();
  tt->add_option("--sentences", train.input_sentence_size, "Lines sampled for training (0: all)")->capture_default_str();
  tt->add_option("--threads", train.threads, "Trainer threads")->capture_default_str();
  tt->add_option("--seed", train.seed, "The trainer's random seed")->capture_default_str();
  tt->add_option("--out", train_out, "The .model file to write")->required();

  std::string enc_tok, enc_text, enc_file, enc_field = "text";
  bool roundtrip = false, no_cache = false;
  auto* enc = app.add_subcommand("encode",
                                 "Token ids of a text, or of every line of a JSON Lines file (one JSON list per line); "
                                 "--check-roundtrip also decodes and fails (exit 1) on the first text that differs");
  enc->add_option("--tokenizer", enc_tok, "A tokenizer.json, a SentencePiece .model, or 'bytes'")->required();
  enc->add_option("--text", enc_text, "The text");
  enc->add_option("--file", enc_file, "A JSON Lines file");
  enc->add_option("--text-field", enc_field, "Its text field")->capture_default_str();
  enc->add_flag("--check-roundtrip", roundtrip, "decode(encode(text)) must equal text");
  enc->add_flag("--no-cache", no_cache, "Without the tokenizer's word cache (the same ids, slower)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : hp::kConfigErrorExitCode;
  }
  try {
    if (*prep) {
      if (!prep_config.empty()) {
        // The config's data.prepare.* and data.path, read from the file
        // itself: the corpus is what this makes, so the trainer's checks of
        // data.path (a prepared corpus) cannot hold yet.
        auto raw = hp::RawConfig::parse_file(prep_config);
        for (const auto& s : prep_sets) raw.apply_override(s);
        const auto str = [&](const char* key, const std::string& fallback) {
          const auto* e = raw.find(key);
          return e ? e->shown() : fallback;
        };
        const auto num = [&](const char* key, double fallback) {
          const auto* e = raw.find(key);
          if (!e) return fallback;
          try {
            return std::stod(e->shown());
          } catch (const std::exception&) {
            throw tool::UsageError(prep_config + ": " + key + " = " + e->shown() + ": not a number");
          }
        };
        if (o.inputs.empty()) {
          if (const auto* e = raw.find("data.prepare.inputs")) o.inputs = e->items.empty() ? std::vector<std::string>{e->shown()} : e->items;
        }
        if (prep->count("--tokenizer") == 0) o.tokenizer = str("data.prepare.tokenizer", o.tokenizer);
        if (o.out.empty()) o.out = str("data.path", "");
        if (o.split_on.empty()) o.split_on = str("data.prepare.split_on", "");
        if (prep->count("--text-field") == 0) o.text_field = str("data.prepare.text_field", o.text_field);
        if (prep->count("--shard-mb") == 0) o.shard_mb = num("data.prepare.shard_mb", o.shard_mb);
        const auto vocab = static_cast<std::int64_t>(num("data.prepare.train_vocab_size", 0));
        std::error_code ec;
        if (vocab > 0 && !fs::exists(o.tokenizer, ec)) {
          if (o.tokenizer.empty()) throw tool::UsageError(prep_config + ": data.prepare.tokenizer is empty");
          hp::SentencePieceTraining t;
          t.inputs = tool::text_files(o.inputs);
          t.vocab_size = vocab;
          t.threads = o.threads;
          if (fs::path(o.tokenizer).has_parent_path()) fs::create_directories(fs::path(o.tokenizer).parent_path());
          std::cerr << "hp-data prepare: training a SentencePiece model of " << vocab << " pieces at " << o.tokenizer
                    << "\n";
          hp::train_sentencepiece(t, o.tokenizer);
        }
      }
      if (o.inputs.empty()) throw tool::UsageError("prepare: give --input (or data.prepare.inputs with --config)");
      if (o.out.empty()) throw tool::UsageError("prepare: give --out (or data.path with --config)");
      return tool::prepare(o);
    }
    if (*insp) {
      if (config_file.empty()) {
        if (dir.empty()) throw tool::UsageError("inspect: give a prepared DIR or --config FILE");
        return inspect(dir, samples, sample_tokens, !no_checksums);
      }
      auto raw = hp::RawConfig::parse_file(config_file);
      for (const auto& s : sets) raw.apply_override(s);
      std::vector<std::pair<std::string, double>> sources;
      if (const auto* blend = raw.find("data.blend"); blend && !blend->items.empty()) {
        for (const auto& item : blend->items) {
          // Items are flow maps {path: P, weight: W}.
          const auto node = hp::RawConfig::parse_string(item, "data.blend item");
          const auto* p = node.find("path");
          const auto* w = node.find("weight");
          sources.emplace_back(p ? p->shown() : "?", w ? std::stod(w->shown()) : 1.0);
        }
      } else if (const auto* p = raw.find("data.path")) {
        sources.emplace_back(p->shown(), 1.0);
      }
      if (sources.empty()) throw tool::UsageError(config_file + ": sets neither data.path nor data.blend");
      double total = 0;
      for (const auto& s : sources) total += s.second;
      int rc = 0;
      for (const auto& [path, w] : sources) {
        std::printf("== %s  weight %.4g (%.1f %% of samples)\n", path.c_str(), w, 100 * w / total);
        rc = std::max(rc, inspect(path, samples, sample_tokens, !no_checksums));
      }
      return rc;
    }
    if (*enc) {
      const auto tok = hp::load_tokenizer(enc_tok);
      if (no_cache) tok->disable_cache();
      std::vector<std::string> texts;
      if (!enc_file.empty()) {
        std::ifstream in(enc_file);
        if (!in) throw tool::UsageError("--file " + enc_file + ": cannot be read");
        std::string line;
        while (std::getline(in, line)) {
          if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
          texts.push_back(nlohmann::json::parse(line).at(enc_field).get<std::string>());
        }
      } else {
        texts.push_back(enc_text);
      }
      for (std::size_t i = 0; i < texts.size(); ++i) {
        const auto ids = tok->encode(texts[i]);
        std::printf("%s\n", nlohmann::json(ids).dump().c_str());
        if (roundtrip && tok->decode(ids) != texts[i]) {
          std::cerr << "hp-data encode: text " << i << " does not round-trip: '" << printable(texts[i], 120)
                    << "' decodes to '" << printable(tok->decode(ids), 120) << "'\n";
          return 1;
        }
      }
      return 0;
    }
    if (*tt) {
      train.inputs = tool::text_files(train.inputs);
      hp::train_sentencepiece(train, train_out);
      const auto tok = hp::load_tokenizer(train_out);
      std::printf("trained %s: %s, vocabulary %lld, end of document %d, %s\n", train_out.c_str(), tok->kind().c_str(),
                  static_cast<long long>(tok->vocab_size()), tok->eos_id(), tok->hash().c_str());
      return 0;
    }
  } catch (const tool::UsageError& e) {
    std::cerr << "hp-data: " << e.what() << "\n";
    return hp::kConfigErrorExitCode;
  } catch (const hp::ConfigException& e) {
    std::cerr << e.what() << "\n";
    return hp::kConfigErrorExitCode;
  } catch (const std::exception& e) {
    std::cerr << "hp-data: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { hp::tools::exit_now(run(argc, argv)); }
