#include "hp/data/token_shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace fs = std::filesystem;

namespace hp {

namespace {

constexpr char kIdxMagic[8] = {'H', 'P', 'T', 'O', 'K', 'I', 'D', 'X'};
constexpr std::size_t kIdxHeader = 24;

std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error(p.string() + ": cannot be read");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Writes `bytes` to `path` through a temporary file renamed into place
// (a reader never sees a half-written file), fsync'ed.
void write_atomic(const fs::path& path, const void* data, std::size_t n) {
  const fs::path tmp = path.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error(tmp.string() + ": cannot be created (" + std::strerror(errno) + ")");
  const auto* p = static_cast<const char*>(data);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(fd, p + done, n - done);
    if (w <= 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw std::runtime_error(tmp.string() + ": write failed (" + why + ")");
    }
    done += static_cast<std::size_t>(w);
  }
  ::fsync(fd);
  ::close(fd);
  fs::rename(tmp, path);
}

std::uint64_t file_xxh64(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error(p.string() + ": cannot be read");
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    XXH64_update(st, buf.data(), static_cast<std::size_t>(in.gcount()));
  }
  const auto h = XXH64_digest(st);
  XXH64_freeState(st);
  return h;
}

nlohmann::json shard_json(const ShardInfo& s) {
  return {{"name", s.name}, {"documents", s.documents}, {"tokens", s.tokens},
          {"bin_xxh64", s.bin_xxh64}, {"idx_xxh64", s.idx_xxh64}};
}

ShardInfo shard_from_json(const nlohmann::json& j) {
  ShardInfo s;
  s.name = j.at("name").get<std::string>();
  s.documents = j.at("documents").get<std::int64_t>();
  s.tokens = j.at("tokens").get<std::int64_t>();
  s.bin_xxh64 = j.at("bin_xxh64").get<std::string>();
  s.idx_xxh64 = j.at("idx_xxh64").get<std::string>();
  return s;
}

const unsigned char* map_file(const fs::path& p, std::size_t* bytes) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error(p.string() + ": cannot be opened (" + std::strerror(errno) + ")");
  struct stat st {};
  ::fstat(fd, &st);
  *bytes = static_cast<std::size_t>(st.st_size);
  if (*bytes == 0) {
    ::close(fd);
    return nullptr;
  }
  void* m = ::mmap(nullptr, *bytes, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) throw std::runtime_error(p.string() + ": cannot be mapped (" + std::strerror(errno) + ")");
  ::madvise(m, *bytes, MADV_RANDOM);
  return static_cast<const unsigned char*>(m);
}

}  // namespace

int token_bytes_for(std::int64_t vocab) { return vocab <= 65536 ? 2 : 4; }

TokenManifest read_token_manifest(const std::string& dir) {
  const fs::path p = fs::path(dir) / "manifest.json";
  std::error_code ec;
  if (!fs::exists(p, ec))
    throw std::runtime_error(dir + " is not a prepared corpus: it has no manifest.json (make one with hp-data prepare)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text(p));
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(p.string() + ": not valid JSON (" + e.what() + ")");
  }
  if (j.value("format", std::string()) != kTokenFormat)
    throw std::runtime_error(p.string() + ": format is not '" + std::string(kTokenFormat) + "'");
  if (j.value("version", 0) != kTokenFormatVersion)
    throw std::runtime_error(p.string() + ": version " + std::to_string(j.value("version", 0)) +
                             " is not the one this build reads (" + std::to_string(kTokenFormatVersion) + ")");
  TokenManifest m;
  try {
    const auto& t = j.at("tokenizer");
    m.tokenizer_kind = t.at("kind").get<std::string>();
    m.tokenizer_hash = t.at("hash").get<std::string>();
    m.tokenizer_file = t.value("file", std::string());
    m.vocab_size = t.at("vocab_size").get<std::int64_t>();
    m.eos_id = t.at("eos_id").get<std::int32_t>();
    m.token_bytes = j.at("token_bytes").get<int>();
    m.documents = j.at("documents").get<std::int64_t>();
    m.tokens = j.at("tokens").get<std::int64_t>();
    m.input_bytes = j.value("input_bytes", std::int64_t{0});
    for (const auto& s : j.at("shards")) m.shards.push_back(shard_from_json(s));
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(p.string() + ": a field is missing or of the wrong type (" + e.what() + ")");
  }
  return m;
}

void write_token_manifest(const std::string& dir, const TokenManifest& m) {
  nlohmann::json j;
  j["format"] = kTokenFormat;
  j["version"] = kTokenFormatVersion;
  j["tokenizer"] = {{"kind", m.tokenizer_kind}, {"hash", m.tokenizer_hash}, {"file", m.tokenizer_file},
                    {"vocab_size", m.vocab_size}, {"eos_id", m.eos_id}};
  j["token_bytes"] = m.token_bytes;
  j["dtype"] = m.token_bytes == 2 ? "uint16" : "uint32";
  j["documents"] = m.documents;
  j["tokens"] = m.tokens;
  j["input_bytes"] = m.input_bytes;
  j["shards"] = nlohmann::json::array();
  for (const auto& s : m.shards) j["shards"].push_back(shard_json(s));
  const std::string text = j.dump(1) + "\n";
  write_atomic(fs::path(dir) / "manifest.json", text.data(), text.size());
}

ShardInfo write_token_shard(const std::string& dir, const std::string& name, const std::vector<std::uint32_t>& tokens,
                            const std::vector<std::uint64_t>& offsets, int token_bytes) {
  thread_local std::vector<unsigned char> bin;  // capacity reused shard after shard
  bin.resize(tokens.size() * static_cast<std::size_t>(token_bytes));
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::uint32_t v = tokens[i];
    for (int b = 0; b < token_bytes; ++b) bin[i * token_bytes + b] = static_cast<unsigned char>(v >> (8 * b));
  }
  std::vector<unsigned char> idx(kIdxHeader + 8 * offsets.size());
  std::memcpy(idx.data(), kIdxMagic, 8);
  const std::uint32_t version = 1, tb = static_cast<std::uint32_t>(token_bytes);
  const std::uint64_t docs = offsets.empty() ? 0 : offsets.size() - 1;
  std::memcpy(idx.data() + 8, &version, 4);
  std::memcpy(idx.data() + 12, &tb, 4);
  std::memcpy(idx.data() + 16, &docs, 8);
  std::memcpy(idx.data() + kIdxHeader, offsets.data(), 8 * offsets.size());
  const fs::path base = fs::path(dir) / name;
  write_atomic(base.string() + ".bin", bin.data(), bin.size());
  write_atomic(base.string() + ".idx", idx.data(), idx.size());
  ShardInfo s;
  s.name = name;
  s.documents = static_cast<std::int64_t>(docs);
  s.tokens = static_cast<std::int64_t>(tokens.size());
  s.bin_xxh64 = hex64(XXH64(bin.data(), bin.size(), 0));
  s.idx_xxh64 = hex64(XXH64(idx.data(), idx.size(), 0));
  const std::string text = shard_json(s).dump() + "\n";
  write_atomic(base.string() + ".json", text.data(), text.size());  // last: the shard is finished
  return s;
}

bool read_shard_entry(const std::string& dir, const std::string& name, ShardInfo* out) {
  const fs::path p = fs::path(dir) / (name + ".json");
  std::error_code ec;
  if (!fs::exists(p, ec)) return false;
  try {
    *out = shard_from_json(nlohmann::json::parse(read_text(p)));
  } catch (const std::exception&) {
    return false;  // unreadable: the shard is made again
  }
  return true;
}

std::vector<std::string> check_token_dir(const std::string& dir, bool checksums) {
  std::vector<std::string> out;
  TokenManifest m;
  try {
    m = read_token_manifest(dir);
  } catch (const std::exception& e) {
    return {e.what()};
  }
  for (const auto& s : m.shards) {
    const fs::path bin = fs::path(dir) / (s.name + ".bin"), idx = fs::path(dir) / (s.name + ".idx");
    std::error_code ec;
    for (const auto& f : {bin, idx}) {
      if (!fs::exists(f, ec)) out.push_back("shard " + f.string() + " is missing");
    }
    if (!out.empty()) continue;
    const auto bin_size = fs::file_size(bin, ec), idx_size = fs::file_size(idx, ec);
    const auto want_bin = static_cast<std::uintmax_t>(s.tokens) * static_cast<std::uintmax_t>(m.token_bytes);
    const auto want_idx = static_cast<std::uintmax_t>(kIdxHeader + 8 * (s.documents + 1));
    if (bin_size != want_bin) {
      out.push_back("shard " + bin.string() + " has " + std::to_string(bin_size) + " bytes, the manifest says " +
                    std::to_string(want_bin));
      continue;
    }
    if (idx_size != want_idx) {
      out.push_back("shard " + idx.string() + " has " + std::to_string(idx_size) + " bytes, the manifest says " +
                    std::to_string(want_idx));
      continue;
    }
    if (checksums) {
      if (hex64(file_xxh64(bin)) != s.bin_xxh64)
        out.push_back("shard " + bin.string() + " is damaged: its xxh64 differs from the manifest's " + s.bin_xxh64);
      if (hex64(file_xxh64(idx)) != s.idx_xxh64)
        out.push_back("shard " + idx.string() + " is damaged: its xxh64 differs from the manifest's " + s.idx_xxh64);
    }
  }
  return out;
}

std::uint64_t TokenCorpus::Shard::offset(std::int64_t k) const {
  std::uint64_t v;
  std::memcpy(&v, idx + kIdxHeader + 8 * static_cast<std::size_t>(k), 8);
  return v;
}

TokenCorpus::TokenCorpus(const std::string& dir) : dir_(dir), manifest_(read_token_manifest(dir)) {
  const auto problems = check_token_dir(dir, /*checksums=*/false);
  if (!problems.empty()) throw std::runtime_error(problems.front());
  for (const auto& info : manifest_.shards) {
    Shard s;
    s.data = map_file(fs::path(dir) / (info.name + ".bin"), &s.bytes);
    s.idx = map_file(fs::path(dir) / (info.name + ".idx"), &s.idx_bytes);
    if (!s.idx || std::memcmp(s.idx, kIdxMagic, 8) != 0)
      throw std::runtime_error(dir + "/" + info.name + ".idx: not a token index (bad magic)");
    s.first = total_tokens_;
    s.count = info.tokens;
    s.first_doc = total_documents_;
    s.documents = info.documents;
    total_tokens_ += s.count;
    total_documents_ += s.documents;
    shards_.push_back(s);
  }
}

TokenCorpus::~TokenCorpus() {
  for (auto& s : shards_) {
    if (s.data) ::munmap(const_cast<unsigned char*>(s.data), s.bytes);
    if (s.idx) ::munmap(const_cast<unsigned char*>(s.idx), s.idx_bytes);
  }
}

std::int64_t TokenCorpus::document_start(std::int64_t k) const {
  if (k >= total_documents_) return total_tokens_;
  auto it = std::upper_bound(shards_.begin(), shards_.end(), k,
                             [](std::int64_t v, const Shard& s) { return v < s.first_doc; });
  const Shard& s = *(it - 1);
  return s.first + static_cast<std::int64_t>(s.offset(k - s.first_doc));
}

std::int64_t TokenCorpus::document_of(std::int64_t pos) const {
  auto it = std::upper_bound(shards_.begin(), shards_.end(), pos,
                             [](std::int64_t v, const Shard& s) { return v < s.first; });
  // Skip back over empty shards to the one holding pos.
  while (it != shards_.begin() && (it - 1)->count == 0) --it;
  const Shard& s = *(it - 1);
  const std::uint64_t local = static_cast<std::uint64_t>(pos - s.first);
  std::int64_t lo = 0, hi = s.documents;  // last k with offset(k) <= local
  while (hi - lo > 1) {
    const std::int64_t mid = (lo + hi) / 2;
    if (s.offset(mid) <= local) lo = mid; else hi = mid;
  }
  return s.first_doc + lo;
}

void TokenCorpus::read(std::int64_t pos, std::int64_t n, std::int64_t* out) const {
  if (pos < 0 || pos + n > total_tokens_)
    throw std::out_of_range(dir_ + ": tokens [" + std::to_string(pos) + ", " + std::to_string(pos + n) +
                            ") lie outside the corpus of " + std::to_string(total_tokens_));
  auto it = std::upper_bound(shards_.begin(), shards_.end(), pos,
                             [](std::int64_t v, const Shard& s) { return v < s.first; }) - 1;
  const int tb = manifest_.token_bytes;
  while (n > 0) {
    const std::int64_t local = pos - it->first;
    const std::int64_t take = std::min(n, it->count - local);
    const unsigned char* p = it->data + static_cast<std::size_t>(local) * tb;
    if (tb == 2) {
      for (std::int64_t i = 0; i < take; ++i) out[i] = p[2 * i] | (p[2 * i + 1] << 8);
    } else {
      for (std::int64_t i = 0; i < take; ++i) {
        std::uint32_t v;
        std::memcpy(&v, p + 4 * i, 4);
        out[i] = v;
      }
    }
    out += take;
    pos += take;
    n -= take;
    ++it;
  }
}

}  // namespace hp
