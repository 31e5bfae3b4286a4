#pragma once
// The prepared-corpus format (`hp-data prepare` writes it, `data.type:
// tokens` reads it). A directory holds:
//   manifest.json        format, version, tokenizer {kind, hash, vocab_size,
//                        eos_id, file}, dtype, totals and one entry per shard
//                        {name, documents, tokens, bin_xxh64, idx_xxh64}
//   tokenizer.model|json a copy of the tokenizer the shards were made with
//   shard-NNNNN.bin      the token ids, little-endian uint16 when the
//                        vocabulary fits (<= 65536) else uint32; every
//                        document followed by the end-of-document token
//                        (when the tokenizer has one)
//   shard-NNNNN.idx      "HPTOKIDX", u32 version 1, u32 bytes per token,
//                        u64 documents D, u64 offsets[D + 1] (tokens; the
//                        document k is [offsets[k], offsets[k + 1]))
// A finished shard also has shard-NNNNN.json (its manifest entry), written
// last: `prepare` skips shards that have one and never rewrites them.
// Free of LibTorch.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hp {

inline constexpr const char* kTokenFormat = "hyperparallel-tokens";
inline constexpr int kTokenFormatVersion = 1;

struct ShardInfo {
  std::string name;  ///< "shard-00000"
  std::int64_t documents = 0, tokens = 0;
  std::string bin_xxh64, idx_xxh64;  ///< 16 hex digits
};

struct TokenManifest {
  std::string tokenizer_kind, tokenizer_hash, tokenizer_file;
  std::int64_t vocab_size = 0;
  std::int32_t eos_id = -1;
  int token_bytes = 2;  ///< 2 (uint16) or 4 (uint32)
  std::int64_t documents = 0, tokens = 0, input_bytes = 0;
  std::vector<ShardInfo> shards;
};

/// 2 when every id of a vocabulary of `vocab` fits in uint16, else 4.
int token_bytes_for(std::int64_t vocab);

/// Reads DIR/manifest.json. Throws std::runtime_error naming the file.
TokenManifest read_token_manifest(const std::string& dir);
void write_token_manifest(const std::string& dir, const TokenManifest& m);

/// Writes one shard (.bin, .idx, then .json) atomically (temporary files
/// renamed). Returns its entry.
ShardInfo write_token_shard(const std::string& dir, const std::string& name, const std::vector<std::uint32_t>& tokens,
                            const std::vector<std::uint64_t>& doc_offsets, int token_bytes);
/// The entry a finished shard's .json holds; false when there is none.
bool read_shard_entry(const std::string& dir, const std::string& name, ShardInfo* out);

/// Problems with a prepared directory, one line each ("" when sound):
/// a missing shard, a size that disagrees with the manifest, and with
/// `checksums` a .bin or .idx whose xxh64 differs.
std::vector<std::string> check_token_dir(const std::string& dir, bool checksums);

/// A prepared corpus opened by memory map: one stream of tokens (the shards
/// in order) with its document boundaries.
class TokenCorpus {
 public:
  explicit TokenCorpus(const std::string& dir);
  ~TokenCorpus();
  TokenCorpus(const TokenCorpus&) = delete;
  TokenCorpus& operator=(const TokenCorpus&) = delete;

  const TokenManifest& manifest() const { return manifest_; }
  const std::string& dir() const { return dir_; }
  std::int64_t tokens() const { return total_tokens_; }
  std::int64_t documents() const { return total_documents_; }
  /// Stream position where document k starts (k = documents(): the end).
  std::int64_t document_start(std::int64_t k) const;
  /// The document holding stream position `pos`.
  std::int64_t document_of(std::int64_t pos) const;
  /// Copies tokens [pos, pos + n) of the stream.
  void read(std::int64_t pos, std::int64_t n, std::int64_t* out) const;

 private:
  // Both files of a shard stay mapped; the document offsets are read in
  // place (no per-document memory of our own: a rank's anonymous memory
  // does not grow with the corpus).
  struct Shard {
    const unsigned char* data = nullptr;
    std::size_t bytes = 0;
    const unsigned char* idx = nullptr;
    std::size_t idx_bytes = 0;
    std::int64_t first = 0, count = 0;          ///< stream positions
    std::int64_t first_doc = 0, documents = 0;  ///< global document numbers
    std::uint64_t offset(std::int64_t k) const;  ///< offsets[k] of the .idx
  };
  std::string dir_;
  TokenManifest manifest_;
  std::vector<Shard> shards_;
  std::int64_t total_tokens_ = 0, total_documents_ = 0;
};

}  // namespace hp
