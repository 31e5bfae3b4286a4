// hp-data prepare: text files, directories and JSON Lines -> token shards.
//
// The inputs are planned first into shards of about --shard-mb of text,
// cut at document boundaries (the plan is a pure function of the inputs and
// the options, recorded in plan.json). Worker threads take shards in turn;
// each shard is tokenized in memory and written atomically, its .json
// last. A rerun of the same command skips finished shards (never rewritten)
// and refuses a directory planned from other inputs or options.
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "hp/data/token_shards.h"
#include "hp/data/tokenizer.h"
#include "tools/hp_data/hp_data.h"

namespace fs = std::filesystem;

namespace hp::data_tool {

namespace {

struct Segment {
  std::string file;
  std::uint64_t begin = 0, end = 0;
};

struct Input {
  std::string file;
  std::uint64_t size = 0;
  bool jsonl = false;
};

bool is_jsonl(const fs::path& p) { return p.extension() == ".jsonl" || p.extension() == ".ndjson"; }

bool looks_binary(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  char buf[4096];
  in.read(buf, sizeof buf);
  return std::memchr(buf, '\0', static_cast<std::size_t>(in.gcount())) != nullptr;
}

std::vector<Input> list_inputs(const std::vector<std::string>& paths) {
  std::vector<Input> out;
  for (const auto& p : paths) {
    std::error_code ec;
    if (!fs::exists(p, ec)) throw UsageError("--input " + p + ": does not exist");
    std::vector<fs::path> files;
    if (fs::is_directory(p, ec)) {
      for (const auto& e : fs::recursive_directory_iterator(p, ec)) {
        if (e.is_symlink() || !e.is_regular_file()) continue;
        if (e.path().extension() == ".dat") continue;  // fortune's binary index files
        files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());
    } else {
      files.push_back(p);
    }
    for (const auto& f : files) {
      if (!is_jsonl(f) && looks_binary(f)) continue;
      out.push_back({fs::absolute(f).lexically_normal().string(), fs::file_size(f), is_jsonl(f)});
    }
  }
  if (out.empty()) throw UsageError("--input: no text or JSON Lines files found");
  return out;
}

// The first document boundary at or after `at` in `file` (the byte after a
// boundary): after a newline for JSON Lines, after a `split_on` line for
// text with a separator. Returns the file size when none is left.
std::uint64_t next_boundary(const Input& in, std::uint64_t at, const std::string& split_on) {
  if (at == 0) return 0;
  std::ifstream f(in.file, std::ios::binary);
  const std::string sep = "\n" + split_on + "\n";
  const std::size_t back = in.jsonl ? 1 : sep.size();
  std::uint64_t pos = at >= back ? at - back : 0;
  f.seekg(static_cast<std::streamoff>(pos));
  std::string window;
  std::vector<char> buf(1 << 16);
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    window.append(buf.data(), static_cast<std::size_t>(f.gcount()));
    const std::size_t hit = window.find(in.jsonl ? std::string("\n") : sep);
    if (hit != std::string::npos) return std::min<std::uint64_t>(pos + hit + (in.jsonl ? 1 : sep.size()), in.size);
  }
  return in.size;
}

// Shards of about `shard_bytes` of input, cut only at document boundaries
// (between files, and inside a file only for JSON Lines or --split-on).
std::vector<std::vector<Segment>> plan_shards(const std::vector<Input>& inputs, std::uint64_t shard_bytes,
                                              const std::string& split_on) {
  std::vector<std::vector<Segment>> shards(1);
  std::uint64_t filled = 0;
  for (const auto& in : inputs) {
    const bool cuttable = in.jsonl || !split_on.empty();
    std::uint64_t at = 0;
    while (at < in.size) {
      std::uint64_t end = in.size;
      if (cuttable && in.size - at > shard_bytes - std::min(filled, shard_bytes)) {
        end = std::max(at + 1, next_boundary(in, at + (shard_bytes - std::min(filled, shard_bytes)), split_on));
        end = std::min(end, in.size);
      }
      shards.back().push_back({in.file, at, end});
      filled += end - at;
      at = end;
      if (filled >= shard_bytes) {
        shards.emplace_back();
        filled = 0;
      }
    }
  }
  if (shards.back().empty()) shards.pop_back();
  return shards;
}

// Reads a segment into `out` (its capacity reused from shard to shard: a
// fresh 32 MB buffer each time let glibc's heap grow with the corpus).
void read_range(const Segment& s, std::string& out) {
  std::ifstream f(s.file, std::ios::binary);
  if (!f) throw std::runtime_error(s.file + ": cannot be read");
  f.seekg(static_cast<std::streamoff>(s.begin));
  out.resize(s.end - s.begin);
  f.read(out.data(), static_cast<std::streamsize>(out.size()));
  if (static_cast<std::uint64_t>(f.gcount()) != s.end - s.begin)
    throw std::runtime_error(s.file + ": changed while being read (shorter than planned)");
}

// Calls doc(text) for every document of a segment.
template <class F>
void documents_of(const Segment& s, bool jsonl, const Options& o, F&& doc) {
  thread_local std::string buffer;
  read_range(s, buffer);
  const std::string& text = buffer;
  if (jsonl) {
    std::size_t at = 0;
    std::uint64_t line_no = 0;
    while (at < text.size()) {
      std::size_t nl = text.find('\n', at);
      if (nl == std::string::npos) nl = text.size();
      ++line_no;
      const std::string_view line(text.data() + at, nl - at);
      at = nl + 1;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const std::exception& e) {
        throw std::runtime_error(s.file + " (line " + std::to_string(line_no) + " after byte " +
                                 std::to_string(s.begin) + "): not JSON (" + e.what() + ")");
      }
      if (!j.is_object() || !j.contains(o.text_field) || !j[o.text_field].is_string())
        throw std::runtime_error(s.file + " (line " + std::to_string(line_no) + " after byte " + std::to_string(s.begin) +
                                 "): no string field '" + o.text_field + "' (choose it with --text-field)");
      doc(j[o.text_field].get_ref<const std::string&>());
    }
    return;
  }
  if (o.split_on.empty()) {
    doc(text);
    return;
  }
  // Documents separated by lines equal to split_on (the line dropped).
  std::size_t start = 0, at = 0;
  while (at <= text.size()) {
    std::size_t nl = text.find('\n', at);
    const std::size_t line_end = nl == std::string::npos ? text.size() : nl;
    const std::string_view line(text.data() + at, line_end - at);
    if (line == o.split_on) {
      if (at > start) doc(std::string_view(text.data() + start, at - start));
      start = nl == std::string::npos ? text.size() : nl + 1;
    }
    if (nl == std::string::npos) break;
    at = nl + 1;
  }
  if (start < text.size() && text.find_first_not_of(" \t\r\n", start) != std::string::npos)
    doc(std::string_view(text.data() + start, text.size() - start));
}

std::string shard_name(std::size_t i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "shard-%05zu", i);
  return buf;
}

std::string fmt_duration(double s) {
  if (!(s >= 0) || s > 1e7) return "--:--";
  const auto t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

}  // namespace

std::vector<std::string> text_files(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const auto& in : list_inputs(paths)) {
    if (!in.jsonl) out.push_back(in.file);
  }
  return out;
}

int prepare(const Options& o) {
  if (o.inputs.empty()) throw UsageError("prepare: give at least one --input");
  if (o.out.empty()) throw UsageError("prepare: --out DIR is required");
  if (o.shard_mb <= 0) throw UsageError("--shard-mb " + std::to_string(o.shard_mb) + ": must be > 0");
  const auto tok = load_tokenizer(o.tokenizer);
  const auto inputs = list_inputs(o.inputs);
  const auto shard_bytes = static_cast<std::uint64_t>(o.shard_mb * 1024.0 * 1024.0);
  const auto shards = plan_shards(inputs, std::max<std::uint64_t>(1, shard_bytes), o.split_on);
  const bool eod = tok->eos_id() >= 0;

  nlohmann::json plan;
  plan["tokenizer_hash"] = tok->hash();
  plan["split_on"] = o.split_on;
  plan["text_field"] = o.text_field;
  plan["shard_bytes"] = shard_bytes;
  plan["inputs"] = nlohmann::json::array();
  for (const auto& in : inputs) plan["inputs"].push_back({{"file", in.file}, {"bytes", in.size}, {"jsonl", in.jsonl}});
  plan["shards"] = nlohmann::json::array();
  for (const auto& s : shards) {
    nlohmann::json segs = nlohmann::json::array();
    for (const auto& g : s) segs.push_back({g.file, g.begin, g.end});
    plan["shards"].push_back(segs);
  }
  fs::create_directories(o.out);
  const fs::path plan_file = fs::path(o.out) / "plan.json";
  std::error_code ec;
  if (fs::exists(plan_file, ec)) {
    std::ifstream in(plan_file);
    nlohmann::json old;
    try {
      old = nlohmann::json::parse(in);
    } catch (const std::exception&) {
    }
    if (old != plan) {
      throw UsageError("--out " + o.out + ": holds a prepare of other inputs, tokenizer or options (plan.json differs); "
                       "rerun the command that made it, or choose a new --out");
    }
  } else {
    const std::string text = plan.dump(1) + "\n";
    std::ofstream(plan_file.string() + ".tmp") << text;
    fs::rename(plan_file.string() + ".tmp", plan_file);
  }
  // The tokenizer travels with the shards.
  std::string tok_copy = "bytes";
  if (o.tokenizer != "bytes") {
    tok_copy = tok->kind() == "bpe" ? "tokenizer.json" : "tokenizer.model";
    const fs::path dst = fs::path(o.out) / tok_copy;
    if (!fs::exists(dst, ec)) {
      fs::copy_file(o.tokenizer, dst.string() + ".tmp", fs::copy_options::overwrite_existing);
      fs::rename(dst.string() + ".tmp", dst);
    }
  }

  std::uint64_t total_bytes = 0, done_bytes_before = 0;
  std::vector<std::uint64_t> shard_bytes_of(shards.size());
  std::vector<ShardInfo> infos(shards.size());
  std::vector<char> finished(shards.size(), 0);
  std::vector<std::size_t> todo;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    for (const auto& g : shards[i]) shard_bytes_of[i] += g.end - g.begin;
    total_bytes += shard_bytes_of[i];
    if (read_shard_entry(o.out, shard_name(i), &infos[i])) {
      finished[i] = 1;
      done_bytes_before += shard_bytes_of[i];
    } else {
      todo.push_back(i);
    }
  }
  if (!todo.empty() && todo.size() < shards.size()) {
    std::cerr << "hp-data prepare: continuing: " << shards.size() - todo.size() << " of " << shards.size()
              << " shards already finished\n";
  }
  std::size_t limit = todo.size();
  if (o.stop_after_shards > 0) limit = std::min<std::size_t>(limit, static_cast<std::size_t>(o.stop_after_shards));
  const int threads = std::max(1, std::min<int>(o.threads, static_cast<int>(std::max<std::size_t>(1, limit))));

  std::atomic<std::size_t> next{0};
  std::atomic<std::uint64_t> bytes_done{0};
  std::atomic<std::size_t> shards_done{0};
  std::mutex err_mu;
  std::string error;
  const auto work = [&] {
    for (;;) {
      const std::size_t k = next.fetch_add(1);
      if (k >= limit) return;
      {
        std::lock_guard<std::mutex> g(err_mu);
        if (!error.empty()) return;
      }
      const std::size_t i = todo[k];
      try {
        thread_local std::vector<std::uint32_t> tokens;
        thread_local std::vector<std::uint64_t> offsets;
        tokens.clear();
        offsets.assign(1, 0);
        for (const auto& seg : shards[i]) {
          const bool jsonl = std::find_if(inputs.begin(), inputs.end(), [&](const Input& in) {
                               return in.file == seg.file;
                             })->jsonl;
          std::uint64_t counted = 0;  // progress by document, the rest at the segment's end
          documents_of(seg, jsonl, o, [&](std::string_view text) {
            for (auto id : tok->encode(text)) tokens.push_back(static_cast<std::uint32_t>(id));
            if (eod) tokens.push_back(static_cast<std::uint32_t>(tok->eos_id()));
            offsets.push_back(tokens.size());
            bytes_done += text.size();
            counted += text.size();
          });
          bytes_done += (seg.end - seg.begin) - std::min<std::uint64_t>(counted, seg.end - seg.begin);
        }
        infos[i] = write_token_shard(o.out, shard_name(i), tokens, offsets, token_bytes_for(tok->vocab_size()));
        finished[i] = 1;
        ++shards_done;
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> g(err_mu);
        if (error.empty()) error = shard_name(i) + ": " + e.what();
        return;
      }
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(work);
  const bool tty = isatty(2) != 0;
  auto last_print = t0;
  const std::uint64_t todo_bytes = [&] {
    std::uint64_t b = 0;
    for (std::size_t k = 0; k < limit; ++k) b += shard_bytes_of[todo[k]];
    return b;
  }();
  const auto progress = [&](bool final) {
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double done = static_cast<double>(bytes_done.load());
    const double rate = dt > 0 ? done / dt : 0;
    const double frac = total_bytes ? (static_cast<double>(done_bytes_before) + done) / static_cast<double>(total_bytes) : 1;
    const int width = 30, fill = static_cast<int>(frac * width);
    char line[256];
    std::snprintf(line, sizeof line, "prepare [%s%s] %5.1f%%  %.1f / %.1f MB  %.1f MB/s  ETA %s  shards %zu/%zu",
                  std::string(static_cast<std::size_t>(fill), '#').c_str(),
                  std::string(static_cast<std::size_t>(width - fill), '.').c_str(), 100 * frac,
                  (static_cast<double>(done_bytes_before) + done) / 1e6, static_cast<double>(total_bytes) / 1e6,
                  rate / 1e6, fmt_duration(rate > 0 ? (static_cast<double>(todo_bytes) - done) / rate : -1).c_str(),
                  shards.size() - todo.size() + shards_done.load(), shards.size());
    std::cerr << (tty ? "\r" : "") << line << (tty && !final ? "" : "\n") << std::flush;
  };
  while (shards_done.load() < limit) {
    {
      std::lock_guard<std::mutex> g(err_mu);
      if (!error.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const auto now = std::chrono::steady_clock::now();
    if (now - last_print > std::chrono::milliseconds(tty ? 250 : 10000)) {
      progress(false);
      last_print = now;
    }
  }
  for (auto& t : pool) t.join();
  if (!error.empty()) throw std::runtime_error(error);
  if (!todo.empty()) progress(true);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (std::count(finished.begin(), finished.end(), 1) < static_cast<long>(shards.size())) {
    std::cerr << "hp-data prepare: stopped after " << limit << " new shard(s) (--stop-after-shards); "
              << std::count(finished.begin(), finished.end(), 1) << " of " << shards.size()
              << " finished; run the same command again to continue\n";
    return 0;
  }
  TokenManifest m;
  m.tokenizer_kind = tok->kind();
  m.tokenizer_hash = tok->hash();
  m.tokenizer_file = tok_copy;
  m.vocab_size = tok->vocab_size();
  m.eos_id = tok->eos_id();
  m.token_bytes = token_bytes_for(tok->vocab_size());
  m.input_bytes = static_cast<std::int64_t>(total_bytes);
  for (const auto& s : infos) {
    m.documents += s.documents;
    m.tokens += s.tokens;
    m.shards.push_back(s);
  }
  write_token_manifest(o.out, m);
  if (todo.empty()) {
    std::printf("%s is already prepared: %zu shards, %lld documents, %lld tokens; nothing to do\n", o.out.c_str(),
                shards.size(), static_cast<long long>(m.documents), static_cast<long long>(m.tokens));
    return 0;
  }
  const auto [hits, lookups] = tok->cache_hits_and_lookups();
  std::printf("prepared %s: %zu shards, %lld documents, %lld tokens (%s), %.1f MB of text in %.2f s = %.1f MB/s "
              "with %d threads, %.3f tokens/byte%s\n",
              o.out.c_str(), shards.size(), static_cast<long long>(m.documents), static_cast<long long>(m.tokens),
              m.token_bytes == 2 ? "uint16" : "uint32", static_cast<double>(bytes_done.load()) / 1e6, dt,
              dt > 0 ? static_cast<double>(bytes_done.load()) / 1e6 / dt : 0.0, threads,
              total_bytes ? static_cast<double>(m.tokens) / static_cast<double>(total_bytes) : 0.0,
              lookups ? (", word cache hit rate " + std::to_string(100.0 * static_cast<double>(hits) /
                                                                   static_cast<double>(lookups)).substr(0, 5) + " %").c_str()
                      : "");
  return 0;
}

}  // namespace hp::data_tool
