#include "hp/data/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <dlfcn.h>
#include <pcre2.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "hp/memory/allocator.h"

namespace fs = std::filesystem;

namespace hp {

namespace {

std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("tokenizer " + path + ": cannot be read (missing file or no permission)");
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

const std::string kByteName = "hyperparallel byte tokenizer, ids 0-255";

void check_ids(const std::vector<std::int32_t>& ids, std::int64_t n, const std::string& who) {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= n)
      throw std::out_of_range(who + ": id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                              " is outside [0, " + std::to_string(n - 1) + "]");
  }
}

// --------------------------------------------------------------- bytes ----

class ByteTokenizer : public Tokenizer {
 public:
  std::string kind() const override { return "bytes"; }
  std::vector<std::int32_t> encode(std::string_view text) const override {
    std::vector<std::int32_t> ids(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  std::string decode(const std::vector<std::int32_t>& ids) const override {
    check_ids(ids, 256, "bytes tokenizer");
    std::string out(ids.size(), '\0');
    for (std::size_t i = 0; i < ids.size(); ++i) out[i] = static_cast<char>(ids[i]);
    return out;
  }
  std::int64_t vocab_size() const override { return 256; }
  std::int32_t eos_id() const override { return -1; }
  std::vector<std::pair<std::string, std::int32_t>> special_tokens() const override { return {}; }
  std::string hash() const override { return "bytes:" + hex64(XXH64(kByteName.data(), kByteName.size(), 0)); }
};

// --------------------------------------------------- byte-level BPE ----

// GPT-2's map from bytes to printable code points: the 188 printable
// Latin-1 bytes map to themselves, the other 68 to 256, 257, ... in order.
std::vector<std::uint32_t> byte_to_codepoint() {
  std::vector<std::uint32_t> map(256);
  std::uint32_t extra = 0;
  for (std::uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    map[b] = printable ? b : 256 + extra++;
  }
  return map;
}

// Decodes UTF-8 into code points; false on malformed input.
bool utf8_codepoints(const std::string& s, std::vector<std::uint32_t>& out) {
  out.clear();
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    std::uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 2) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    out.push_back(cp);
    i += n;
  }
  return true;
}

// The length of the valid UTF-8 sequence starting at s[i] (0: invalid).
std::size_t utf8_char_len(std::string_view s, std::size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  std::size_t n = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >> 4) == 14 ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return 0;
  }
  if (n == 3) {
    const auto d = static_cast<unsigned char>(s[i + 1]);
    if ((c == 0xE0 && d < 0xA0) || (c == 0xED && d >= 0xA0)) return 0;  // overlong, surrogates
  }
  if (n == 4) {
    const auto d = static_cast<unsigned char>(s[i + 1]);
    if ((c == 0xF0 && d < 0x90) || (c == 0xF4 && d >= 0x90)) return 0;
  }
  return n;
}

const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where) {
    int code = 0;
    PCRE2_SIZE offset = 0;
    re_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                        &code, &offset, nullptr);
    if (!re_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(code, msg, sizeof msg);
      throw std::runtime_error(where + ": the pre-tokenizer regex does not compile at offset " +
                               std::to_string(offset) + " (" + reinterpret_cast<char*>(msg) + ")");
    }
    pcre2_jit_compile(re_, PCRE2_JIT_COMPLETE);  // falls back to the interpreter when JIT is unavailable
  }
  ~Regex() { pcre2_code_free(re_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls f(begin, end) for every match and every gap between matches
  // ("Isolated"), over valid UTF-8 `text`.
  template <class F>
  void split(std::string_view text, F&& f) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(re_, nullptr);
    std::size_t at = 0, last = 0;
    while (at < text.size()) {
      const int rc = pcre2_match(re_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), at,
                                 PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      if (ov[0] > last) f(last, ov[0]);
      if (ov[1] == ov[0]) {  // an empty match: step over one character
        at = ov[1] + std::max<std::size_t>(1, utf8_char_len(text, ov[1]));
        continue;
      }
      f(ov[0], ov[1]);
      at = last = ov[1];
    }
    if (last < text.size()) f(last, text.size());
    pcre2_match_data_free(md);
  }

 private:
  pcre2_code* re_ = nullptr;
};

std::atomic<std::uint64_t> g_tokenizer_instances{0};

class BpeTokenizer : public Tokenizer {
 public:
  BpeTokenizer(const std::string& path, const std::string& blob) : path_(path), instance_(++g_tokenizer_instances) {
    hash_ = "bpe:" + hex64(XXH64(blob.data(), blob.size(), 0));
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(blob);
    } catch (const std::exception& e) {
      throw std::runtime_error("tokenizer " + path + ": not valid JSON (" + e.what() + ")");
    }
    const auto refuse = [&](const std::string& what) {
      throw std::runtime_error("tokenizer " + path + ": " + what);
    };
    if (!j.contains("model") || !j["model"].is_object()) refuse("no 'model' object (not a Hugging Face tokenizer.json)");
    const auto& m = j["model"];
    if (m.value("type", std::string("BPE")) != "BPE")
      refuse("model.type is '" + m.value("type", std::string()) + "'; only byte-level BPE is read (use a SentencePiece .model for unigram)");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (m.contains(k) && !m[k].is_null() && !(m[k].is_string() && m[k].get<std::string>().empty()))
        refuse(std::string("model.") + k + " is set; only byte-level BPE without word affixes is read");
    }
    if (m.value("byte_fallback", false)) refuse("model.byte_fallback is true; byte-level BPE needs no fallback");
    if (j.contains("normalizer") && !j["normalizer"].is_null())
      refuse("normalizer '" + j["normalizer"].value("type", std::string("?")) +
             "' is not supported (only tokenizers without a normalizer, such as GPT-2's and Llama 3's)");
    ignore_merges_ = m.value("ignore_merges", false);

    // Pre-tokenizer: ByteLevel (with GPT-2's regex unless use_regex is
    // false), or a Sequence of Split(regex, Isolated) and ByteLevel.
    std::string pattern;
    bool byte_level = false;
    const auto take = [&](const nlohmann::json& p, const auto& self) -> void {
      const std::string type = p.value("type", std::string());
      if (type == "ByteLevel") {
        byte_level = true;
        if (p.value("add_prefix_space", false)) add_prefix_space_ = true;
        if (p.value("use_regex", true)) {
          if (!pattern.empty()) refuse("two pre-tokenizer regexes");
          pattern = kGpt2Pattern;
        }
      } else if (type == "Split") {
        if (p.value("behavior", std::string("Isolated")) != "Isolated" || p.value("invert", false))
          refuse("pre_tokenizer Split with behavior '" + p.value("behavior", std::string()) +
                 "' is not supported (only Isolated, not inverted)");
        const auto& pat = p["pattern"];
        if (!pattern.empty()) refuse("two pre-tokenizer regexes");
        if (pat.contains("Regex")) {
          pattern = pat["Regex"].get<std::string>();
        } else if (pat.contains("String")) {
          // A literal: quote it for PCRE2.
          pattern = "\\Q" + pat["String"].get<std::string>() + "\\E";
        } else {
          refuse("pre_tokenizer Split has no pattern");
        }
      } else if (type == "Sequence") {
        for (const auto& q : p["pretokenizers"]) self(q, self);
      } else {
        refuse("pre_tokenizer '" + type + "' is not supported (ByteLevel, Split, Sequence)");
      }
    };
    if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()) take(j["pre_tokenizer"], take);
    if (!byte_level) refuse("no ByteLevel pre-tokenizer; only byte-level BPE is read");
    if (!pattern.empty()) regex_ = std::make_unique<Regex>(pattern, "tokenizer " + path);

    // Vocabulary, mapped back from GPT-2's printable alphabet to bytes.
    const auto b2c = byte_to_codepoint();
    std::unordered_map<std::uint32_t, int> c2b;
    for (int b = 0; b < 256; ++b) c2b[b2c[b]] = b;
    const auto to_bytes = [&](const std::string& s) {
      std::vector<std::uint32_t> cps;
      std::string out;
      if (!utf8_codepoints(s, cps)) return s;
      for (auto cp : cps) {
        auto it = c2b.find(cp);
        if (it == c2b.end()) return s;  // not in the byte alphabet: its own text
        out.push_back(static_cast<char>(it->second));
      }
      return out;
    };
    if (!m.contains("vocab") || !m["vocab"].is_object()) refuse("model.vocab is missing");
    std::int64_t max_id = -1;
    for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
      const std::string bytes = to_bytes(it.key());
      const auto id = it.value().get<std::int64_t>();
      if (id < 0 || id > INT32_MAX) refuse("vocab entry '" + it.key() + "' has id " + std::to_string(id));
      by_bytes_[bytes] = static_cast<std::int32_t>(id);
      max_id = std::max(max_id, id);
      if (static_cast<std::size_t>(id) >= pieces_.size()) pieces_.resize(id + 1);
      pieces_[id] = bytes;
    }
    for (int b = 0; b < 256; ++b) {
      auto it = by_bytes_.find(std::string(1, static_cast<char>(b)));
      byte_id_[b] = it == by_bytes_.end() ? -1 : it->second;
    }
    // Merges: "a b" strings or [a, b] pairs; rank = position.
    if (m.contains("merges")) {
      std::int32_t rank = 0;
      for (const auto& e : m["merges"]) {
        std::string a, b;
        if (e.is_string()) {
          const auto s = e.get<std::string>();
          const auto sp = s.find(' ');
          if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
            refuse("merge '" + s + "' (rank " + std::to_string(rank) + ") is not two tokens separated by one space");
          a = s.substr(0, sp);
          b = s.substr(sp + 1);
        } else if (e.is_array() && e.size() == 2) {
          a = e[0].get<std::string>();
          b = e[1].get<std::string>();
        } else {
          refuse("merge at rank " + std::to_string(rank) + " is neither \"a b\" nor [a, b]");
        }
        const std::string ab = to_bytes(a), bb = to_bytes(b);
        auto ia = by_bytes_.find(ab), ib = by_bytes_.find(bb), im = by_bytes_.find(ab + bb);
        if (ia == by_bytes_.end() || ib == by_bytes_.end() || im == by_bytes_.end())
          refuse("merge '" + a + " " + b + "' (rank " + std::to_string(rank) + ") names a token not in the vocabulary");
        const auto key = (static_cast<std::uint64_t>(ia->second) << 32) | static_cast<std::uint32_t>(ib->second);
        merges_.emplace(key, std::make_pair(rank, im->second));  // the first (best) rank wins
        ++rank;
      }
    }
    // Added tokens: decoded as their text; the vocabulary covers them.
    if (j.contains("added_tokens")) {
      for (const auto& t : j["added_tokens"]) {
        const auto id = t.at("id").get<std::int64_t>();
        const auto content = t.at("content").get<std::string>();
        max_id = std::max(max_id, id);
        if (static_cast<std::size_t>(id) >= pieces_.size()) pieces_.resize(id + 1);
        pieces_[id] = content;
        if (t.value("special", false)) specials_[content] = static_cast<std::int32_t>(id);
      }
    }
    vocab_size_ = max_id + 1;
    for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>"}) {
      auto it = specials_.find(name);
      if (it == specials_.end()) {
        auto v = by_bytes_.find(name);
        if (v == by_bytes_.end()) continue;
        eos_ = v->second;
      } else {
        eos_ = it->second;
      }
      break;
    }
  }

  std::string kind() const override { return "bpe"; }
  std::vector<std::pair<std::string, std::int32_t>> special_tokens() const override {
    std::vector<std::pair<std::string, std::int32_t>> out(specials_.begin(), specials_.end());
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    return out;
  }
  std::int64_t vocab_size() const override { return vocab_size_; }
  std::int32_t eos_id() const override { return eos_; }
  std::string hash() const override { return hash_; }

  std::vector<std::int32_t> encode(std::string_view text) const override {
    std::string prefixed;
    if (add_prefix_space_ && !text.empty() && text[0] != ' ') {
      prefixed = " " + std::string(text);
      text = prefixed;
    }
    std::vector<std::int32_t> out;
    // Valid UTF-8 runs go through the regex; each malformed byte is a piece
    // of its own (byte-level BPE has a token for every byte).
    std::size_t i = 0;
    while (i < text.size()) {
      std::size_t j = i;
      while (j < text.size()) {
        const std::size_t n = utf8_char_len(text, j);
        if (n == 0) break;
        j += n;
      }
      if (j > i) {
        const std::string_view run = text.substr(i, j - i);
        if (regex_) {
          regex_->split(run, [&](std::size_t a, std::size_t b) { encode_piece(run.substr(a, b - a), out); });
        } else {
          encode_piece(run, out);
        }
      }
      if (j < text.size()) {
        encode_piece(text.substr(j, 1), out);
        ++j;
      }
      i = j;
    }
    return out;
  }

  std::string decode(const std::vector<std::int32_t>& ids) const override {
    check_ids(ids, vocab_size_, "tokenizer " + path_);
    std::string out;
    for (auto id : ids) out += pieces_[id];
    return out;
  }

  std::pair<std::uint64_t, std::uint64_t> cache_hits_and_lookups() const override {
    return {hits_.load(), lookups_.load()};
  }
  void disable_cache() override { cache_on_ = false; }

 private:
  struct Cache {
    std::uint64_t owner = 0;
    std::unordered_map<std::string, std::vector<std::int32_t>> words;
  };

  void encode_piece(std::string_view piece, std::vector<std::int32_t>& out) const {
    thread_local Cache cache;
    if (cache.owner != instance_) {
      cache.words.clear();
      cache.owner = instance_;
    }
    const bool cacheable = cache_on_ && piece.size() < 256;
    if (cacheable) {
      lookups_.fetch_add(1, std::memory_order_relaxed);
      auto it = cache.words.find(std::string(piece));
      if (it != cache.words.end()) {
        hits_.fetch_add(1, std::memory_order_relaxed);
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<std::int32_t> ids = merge(piece);
    out.insert(out.end(), ids.begin(), ids.end());
    if (cacheable) {
      if (cache.words.size() > (1u << 18)) cache.words.clear();  // bounded memory
      cache.words.emplace(std::string(piece), std::move(ids));
    }
  }

  // Byte-level BPE of one pre-token: repeatedly merge the adjacent pair of
  // lowest rank, the leftmost among equals (a heap keyed by rank, position).
  std::vector<std::int32_t> merge(std::string_view piece) const {
    if (ignore_merges_) {
      auto it = by_bytes_.find(std::string(piece));
      if (it != by_bytes_.end()) return {it->second};
    }
    const std::size_t n = piece.size();
    std::vector<std::int32_t> id(n);
    std::vector<std::int64_t> prev(n), next(n);
    for (std::size_t k = 0; k < n; ++k) {
      const int b = static_cast<unsigned char>(piece[k]);
      if (byte_id_[b] < 0)
        throw std::runtime_error("tokenizer " + path_ + ": byte 0x" + hex64(b).substr(14) + " has no token");
      id[k] = byte_id_[b];
      prev[k] = static_cast<std::int64_t>(k) - 1;
      next[k] = k + 1 < n ? static_cast<std::int64_t>(k + 1) : -1;
    }
    struct Cand {
      std::int32_t rank;
      std::int64_t pos;
      std::int32_t left, right;  // ids when pushed: stale entries are skipped
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    const auto push = [&](std::int64_t p) {
      if (p < 0 || next[p] < 0) return;
      const auto key = (static_cast<std::uint64_t>(id[p]) << 32) | static_cast<std::uint32_t>(id[next[p]]);
      auto it = merges_.find(key);
      if (it != merges_.end()) heap.push({it->second.first, p, id[p], id[next[p]]});
    };
    for (std::size_t k = 0; k + 1 < n; ++k) push(static_cast<std::int64_t>(k));
    std::vector<bool> dead(n, false);
    while (!heap.empty()) {
      const Cand c = heap.top();
      heap.pop();
      const std::int64_t p = c.pos;
      if (dead[p] || next[p] < 0 || id[p] != c.left || id[next[p]] != c.right) continue;
      const auto key = (static_cast<std::uint64_t>(c.left) << 32) | static_cast<std::uint32_t>(c.right);
      const std::int64_t q = next[p];
      id[p] = merges_.at(key).second;
      dead[q] = true;
      next[p] = next[q];
      if (next[q] >= 0) prev[next[q]] = p;
      push(prev[p]);
      push(p);
    }
    std::vector<std::int32_t> out;
    for (std::int64_t k = n ? 0 : -1; k >= 0; k = next[k]) out.push_back(id[k]);
    return out;
  }

  std::string path_, hash_;
  std::uint64_t instance_;
  std::unique_ptr<Regex> regex_;
  bool add_prefix_space_ = false, ignore_merges_ = false, cache_on_ = true;
  std::unordered_map<std::string, std::int32_t> by_bytes_, specials_;
  std::vector<std::string> pieces_;
  std::int32_t byte_id_[256];
  std::unordered_map<std::uint64_t, std::pair<std::int32_t, std::int32_t>> merges_;
  std::int64_t vocab_size_ = 0;
  std::int32_t eos_ = -1;
  mutable std::atomic<std::uint64_t> hits_{0}, lookups_{0};
};

// ------------------------------------------------------- SentencePiece ----

struct SpmModule {
  void* lib = nullptr;
  void* (*load)(const char*, std::size_t, char*, std::size_t) = nullptr;
  void (*free_)(void*) = nullptr;
  int (*piece_size)(const void*) = nullptr;
  int (*eos_id)(const void*) = nullptr;
  int (*encode)(const void*, const char*, std::size_t, std::int32_t**, std::size_t*, char*, std::size_t) = nullptr;
  int (*decode)(const void*, const std::int32_t*, std::size_t, char**, std::size_t*, char*, std::size_t) = nullptr;
  int (*train)(const char* const*, const char* const*, std::size_t, unsigned, char*, std::size_t) = nullptr;
  int (*encode_scored)(const void*, const char*, std::size_t, std::int32_t**, std::size_t*, float*, float*, char*,
                       std::size_t) = nullptr;
  int (*is_special)(const void*, int) = nullptr;
  const char* (*piece)(const void*, int) = nullptr;
};

std::string this_library_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&this_library_dir), &info) && info.dli_fname) {
    return fs::path(info.dli_fname).parent_path().string();
  }
  return "";
}

const SpmModule& spm_module() {
  static std::once_flag once;
  static SpmModule mod;
  static std::string error;
  std::call_once(once, [] {
    std::vector<std::string> tried;
    if (const char* env = std::getenv("HP_SENTENCEPIECE_MODULE")) tried.push_back(env);
    const auto dir = this_library_dir();
    // The adapter whose local scope finds the process's own malloc first
    // (docs/toolchain.md section 8).
    const std::string name =
        memory::mimalloc_serves_malloc() ? "libhp_sentencepiece_mimalloc.so" : "libhp_sentencepiece.so";
    if (!dir.empty()) tried.push_back((fs::path(dir) / name).string());
    tried.push_back(name);
    std::string why;
    for (const auto& p : tried) {
      mod.lib = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (mod.lib) break;
      const char* e = dlerror();
      why += (why.empty() ? "" : "; ") + p + ": " + (e ? e : "?");
    }
    if (!mod.lib) {
      error = "the SentencePiece adapter libhp_sentencepiece.so cannot be loaded (" + why +
              "); it is built with hyperparallel when libsentencepiece-dev is installed (scripts/install-deps.sh)";
      return;
    }
    const auto sym = [&](const char* name) {
      void* s = dlsym(mod.lib, name);
      if (!s) error = std::string("libhp_sentencepiece.so lacks ") + name + " (a stale build; rebuild)";
      return s;
    };
    mod.load = reinterpret_cast<decltype(mod.load)>(sym("hp_spm_load"));
    mod.free_ = reinterpret_cast<decltype(mod.free_)>(sym("hp_spm_free"));
    mod.piece_size = reinterpret_cast<decltype(mod.piece_size)>(sym("hp_spm_piece_size"));
    mod.eos_id = reinterpret_cast<decltype(mod.eos_id)>(sym("hp_spm_eos_id"));
    mod.encode = reinterpret_cast<decltype(mod.encode)>(sym("hp_spm_encode"));
    mod.decode = reinterpret_cast<decltype(mod.decode)>(sym("hp_spm_decode"));
    mod.train = reinterpret_cast<decltype(mod.train)>(sym("hp_spm_train"));
    mod.encode_scored = reinterpret_cast<decltype(mod.encode_scored)>(sym("hp_spm_encode_scored"));
    mod.is_special = reinterpret_cast<decltype(mod.is_special)>(sym("hp_spm_is_special"));
    mod.piece = reinterpret_cast<decltype(mod.piece)>(sym("hp_spm_piece"));
  });
  if (!error.empty()) throw std::runtime_error(error);
  return mod;
}

class SentencePieceTokenizer : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& path, const std::string& blob) : path_(path), mod_(spm_module()) {
    hash_ = "sentencepiece:" + hex64(XXH64(blob.data(), blob.size(), 0));
    char err[512] = {0};
    handle_ = mod_.load(blob.data(), blob.size(), err, sizeof err);
    if (!handle_) throw std::runtime_error("tokenizer " + path + ": not a SentencePiece model or tokenizer.json (" + err + ")");
    size_ = mod_.piece_size(handle_);
    eos_ = mod_.eos_id(handle_);
    for (int id = 0; id < size_; ++id) {
      if (mod_.is_special(handle_, id)) specials_.emplace_back(mod_.piece(handle_, id), id);
    }
    const auto space = encode_raw(" ");
    const std::size_t half = space.size() / 2;
    cache_on_ = half > 0 && space.size() % 2 == 0 &&
                std::equal(space.begin(), space.begin() + static_cast<std::ptrdiff_t>(half),
                           space.begin() + static_cast<std::ptrdiff_t>(half));
    if (cache_on_) prefix_.assign(space.begin(), space.begin() + static_cast<std::ptrdiff_t>(half));
  }
  ~SentencePieceTokenizer() override { mod_.free_(handle_); }
  std::string kind() const override { return "sentencepiece"; }
  std::vector<std::pair<std::string, std::int32_t>> special_tokens() const override { return specials_; }

  // A word cache, exact. SentencePiece writes each space as U+2581, and no
  // piece holds that mark except first, so every space starts a word no
  // piece crosses: the best segmentation of a text is its words' best
  // segmentations laid end to end. One catch: the search sums float
  // scores over the whole text, so between two segmentations of a word
  // whose scores are (nearly) equal, the text's running sum can tip the
  // choice (measured: "FACILITY REJECTED 100044200000;" in the fortunes
  // gave 0 00 00 for "00000" alone and 00 00 0 in context). So each word
  // in the cache keeps its best score and its margin over the second best
  // (an n-best search, once per distinct word, when it is seen a second
  // time), and a text whose words are all cached with a margin above what
  // float rounding at the text's running sum can reach takes their cached
  // ids; any other text (a word seen for the first time, a near tie) goes
  // to the library whole. Words are cut before each space; a word encoded alone gets the
  // dummy prefix mark in front, and for a word starting with a space that
  // prefix's ids (`prefix_`, half of the ids of " ") are dropped. When " "
  // does not encode to two equal halves the cache stays off. The tests
  // compare every text with and without the cache.
  std::vector<std::int32_t> encode(std::string_view text) const override {
    if (!cache_on_ || text.empty()) return encode_raw(text);
    thread_local Cache cache;
    if (cache.owner != instance_) {
      cache.words.clear();
      cache.seen.clear();
      cache.owner = instance_;
    }
    thread_local std::vector<const Word*> words;
    thread_local std::vector<std::size_t> lengths;
    words.clear();
    lengths.clear();
    double sum = 0;      // |the text's best score|: a bound on its running sum
    bool whole = false;  // a word not (yet) in the cache: the library encodes the text
    std::size_t start = 0;
    for (std::size_t i = 1; i <= text.size(); ++i) {
      if (i < text.size() && text[i] != ' ') continue;
      const std::string_view w = text.substr(start, i - start);
      start = i;
      if (w.size() >= 256) return encode_raw(text);  // long words are not cached
      lookups_.fetch_add(1, std::memory_order_relaxed);
      const std::uint64_t key = XXH64(w.data(), w.size(), 0);
      auto it = cache.words.find(key);
      if (it != cache.words.end() && it->second.text == w) {
        hits_.fetch_add(1, std::memory_order_relaxed);
      } else if (it == cache.words.end() && !cache.seen.insert(key).second) {
        // Seen before: worth its n-best search now. A word seen once is
        // never scored (its text goes to the library whole anyway).
        if (cache.words.size() > (1u << 18)) cache.words.clear();  // bounded memory
        if (cache.seen.size() > (1u << 20)) cache.seen.clear();
        it = cache.words.emplace(key, score_word(w)).first;
      } else {
        whole = true;  // first sight, or a hash shared with another word
        continue;
      }
      words.push_back(&it->second);
      lengths.push_back(w.size());
      sum += std::fabs(it->second.best);
    }
    if (whole) return encode_raw(text);
    // A float sum of magnitude up to `sum` (+ a word's own alternative
    // paths, pieces scoring above -32 each) rounds by at most 2^-23 of it
    // per addition; a word's two paths differ in at most 2 (length + 1)
    // additions; 4x margin.
    for (std::size_t k = 0; k < words.size(); ++k) {
      const double len = static_cast<double>(lengths[k] + 1);
      const double ulp = (sum + 32.0 * len) * 1.1920928955078125e-07;
      if (!(words[k]->gap > 8.0 * len * ulp + 1e-6)) return encode_raw(text);
    }
    std::vector<std::int32_t> out;
    if (text[0] == ' ') out.insert(out.end(), prefix_.begin(), prefix_.end());
    for (const Word* w : words) out.insert(out.end(), w->ids.begin(), w->ids.end());
    return out;
  }
  std::pair<std::uint64_t, std::uint64_t> cache_hits_and_lookups() const override {
    return {hits_.load(), lookups_.load()};
  }
  void disable_cache() override { cache_on_ = false; }

 private:
  struct Word {
    std::string text;
    std::vector<std::int32_t> ids;  ///< in context (the dummy prefix's ids dropped for a spaced word)
    float best = 0, gap = 0;
  };
  // Keyed by the word's xxh64 (no string built per lookup); the entry keeps
  // the text, compared on every hit.
  struct Cache {
    std::uint64_t owner = 0;
    std::unordered_map<std::uint64_t, Word> words;
    std::unordered_set<std::uint64_t> seen;
  };
  Word score_word(std::string_view word) const {
    std::int32_t* ids = nullptr;
    std::size_t n = 0;
    char err[512] = {0};
    Word w;
    w.text = std::string(word);
    const int rc = mod_.encode_scored(handle_, word.data(), word.size(), &ids, &n, &w.best, &w.gap, err, sizeof err);
    if (rc == 1) throw std::runtime_error("tokenizer " + path_ + ": " + err);
    std::size_t skip = 0;
    if (word[0] == ' ') {
      if (n < prefix_.size() || !std::equal(prefix_.begin(), prefix_.end(), ids)) {
        std::free(ids);
        w.gap = 0;  // the rule does not hold for this word: never from the cache
        return w;
      }
      skip = prefix_.size();
    }
    w.ids.assign(ids + skip, ids + n);
    std::free(ids);
    return w;
  }

  std::vector<std::int32_t> encode_raw(std::string_view text) const {
    std::int32_t* ids = nullptr;
    std::size_t n = 0;
    char err[512] = {0};
    if (mod_.encode(handle_, text.data(), text.size(), &ids, &n, err, sizeof err) != 0)
      throw std::runtime_error("tokenizer " + path_ + ": " + err);
    std::vector<std::int32_t> out(ids, ids + n);
    std::free(ids);
    return out;
  }

 public:
  std::string decode(const std::vector<std::int32_t>& ids) const override {
    check_ids(ids, size_, "tokenizer " + path_);
    char* text = nullptr;
    std::size_t n = 0;
    char err[512] = {0};
    if (mod_.decode(handle_, ids.data(), ids.size(), &text, &n, err, sizeof err) != 0)
      throw std::runtime_error("tokenizer " + path_ + ": " + err);
    std::string out(text, n);
    std::free(text);
    return out;
  }
  std::int64_t vocab_size() const override { return size_; }
  std::int32_t eos_id() const override { return eos_; }
  std::string hash() const override { return hash_; }

 private:
  std::string path_, hash_;
  std::uint64_t instance_ = ++g_tokenizer_instances;
  const SpmModule& mod_;
  void* handle_ = nullptr;
  bool cache_on_ = false;
  std::vector<std::int32_t> prefix_;
  std::vector<std::pair<std::string, std::int32_t>> specials_;
  mutable std::atomic<std::uint64_t> hits_{0}, lookups_{0};
  std::int64_t size_ = 0;
  std::int32_t eos_ = -1;
};

bool looks_like_json(const std::string& blob) {
  for (char c : blob) {
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    return c == '{';
  }
  return false;
}

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec) {
  if (spec == "bytes") return make_byte_tokenizer();
  const std::string blob = read_file(spec);
  if (blob.empty()) throw std::runtime_error("tokenizer " + spec + ": the file is empty");
  if (looks_like_json(blob)) return std::make_unique<BpeTokenizer>(spec, blob);
  return std::make_unique<SentencePieceTokenizer>(spec, blob);
}

std::string tokenizer_hash(const std::string& spec) {
  if (spec == "bytes") return make_byte_tokenizer()->hash();
  const std::string blob = read_file(spec);
  return std::string(looks_like_json(blob) ? "bpe:" : "sentencepiece:") + hex64(XXH64(blob.data(), blob.size(), 0));
}

void train_sentencepiece(const SentencePieceTraining& o, const std::string& out) {
  if (o.inputs.empty()) throw std::runtime_error("train-tokenizer: no input files");
  std::string inputs;
  for (const auto& f : o.inputs) {
    if (f.find(',') != std::string::npos)
      throw std::runtime_error("train-tokenizer: input path '" + f + "' holds a comma, which SentencePiece's input list cannot carry");
    inputs += (inputs.empty() ? "" : ",") + f;
  }
  std::string prefix = out;
  if (prefix.size() > 6 && prefix.compare(prefix.size() - 6, 6, ".model") == 0) prefix.resize(prefix.size() - 6);
  const std::vector<std::pair<std::string, std::string>> args = {
      {"input", inputs},
      {"model_prefix", prefix},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"model_type", o.model_type},
      {"character_coverage", "1.0"},
      // No normalisation: decode(encode(text)) == text, newlines and runs of
      // spaces included (lines never hold a newline, so it is byte-coded).
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"byte_fallback", o.byte_fallback ? "true" : "false"},
      {"input_sentence_size", std::to_string(o.input_sentence_size)},
      {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(o.threads)},
      {"minloglevel", "2"},
      {"unk_id", "0"},
      {"eos_id", "1"},
      {"bos_id", "-1"},
      {"pad_id", "-1"},
  };
  std::vector<const char*> keys, values;
  for (const auto& [k, v] : args) {
    keys.push_back(k.c_str());
    values.push_back(v.c_str());
  }
  char err[1024] = {0};
  if (spm_module().train(keys.data(), values.data(), keys.size(), o.seed, err, sizeof err) != 0)
    throw std::runtime_error(std::string("SentencePiece training failed: ") + err);
}

}  // namespace hp
