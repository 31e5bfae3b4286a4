#pragma once
// Tokenizers behind one interface: text -> token ids and back, the
// vocabulary size, the end-of-document token, and a stable hash that a
// prepared corpus records so that a run refuses a tokenizer other than the
// one its shards were made with. Kinds:
//  - bytes: one token per byte, vocabulary 256 (what `data.type: text` reads);
//  - bpe: byte-level BPE from a Hugging Face `tokenizer.json` (GPT-2,
//    Llama 3, Qwen2 style), its pre-tokenizer regex run by PCRE2;
//  - sentencepiece: a `.model` file run by Debian's libsentencepiece, which
//    is loaded into its own symbol scope (framework/data/sentencepiece_module.cpp
//    says why).
// Free of LibTorch.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace hp {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  /// "bytes", "bpe", "sentencepiece".
  virtual std::string kind() const = 0;
  /// Ordinary text: special tokens written inside the text are not matched
  /// (as tiktoken's encode_ordinary); no BOS/EOS added.
  virtual std::vector<std::int32_t> encode(std::string_view text) const = 0;
  /// The bytes of the ids (not necessarily valid UTF-8 for a cut sequence).
  /// Throws std::out_of_range naming the first id outside the vocabulary.
  virtual std::string decode(const std::vector<std::int32_t>& ids) const = 0;
  virtual std::int64_t vocab_size() const = 0;
  /// The token put between documents; -1 when the tokenizer has none (bytes).
  virtual std::int32_t eos_id() const = 0;
  /// The special tokens (control and unknown pieces, a tokenizer.json's
  /// special added tokens) by id; encode() never produces them from text
  /// except the unknown piece.
  virtual std::vector<std::pair<std::string, std::int32_t>> special_tokens() const = 0;
  /// "<kind>:<16 hex digits>": xxh64 of what defines the mapping (the file's
  /// bytes; for bytes a fixed name), equal for equal tokenizers.
  virtual std::string hash() const = 0;
  /// Statistics of a word cache, when the kind has one ({0, 0} otherwise).
  virtual std::pair<std::uint64_t, std::uint64_t> cache_hits_and_lookups() const { return {0, 0}; }
  /// Switches the word cache off (the same ids, computed without it; the
  /// tests compare the two).
  virtual void disable_cache() {}
};

/// One token per byte (ids 0-255), no end-of-document token.
std::unique_ptr<Tokenizer> make_byte_tokenizer();

/// The tokenizer a spec names: "bytes", or a file: a Hugging Face
/// `tokenizer.json` (byte-level BPE) or a SentencePiece `.model`, told
/// apart by content. Throws std::runtime_error naming the file and reason.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec);

class Config;
/// The tokenizer a run reads its data with: bytes for `data.type: text`;
/// for `tokens`, data.tokenizer when set, else the one stored beside the
/// (first blended) corpus. Throws std::invalid_argument naming what is
/// missing, or a data type without tokens.
std::unique_ptr<Tokenizer> run_tokenizer(const Config& c);

/// The hash load_tokenizer(spec)->hash() gives, computed from the file's
/// bytes without loading it ("bytes" gives the byte tokenizer's).
std::string tokenizer_hash(const std::string& spec);

struct SentencePieceTraining {
  std::vector<std::string> inputs;  ///< text files, one sentence per line
  std::int64_t vocab_size = 8000;
  std::string model_type = "unigram";  ///< unigram | bpe
  /// Bytes not covered by pieces become byte tokens (<0x..>): every text
  /// round-trips exactly. Adds 256 pieces to the smallest legal vocabulary.
  bool byte_fallback = true;
  std::int64_t input_sentence_size = 1000000;  ///< sentences sampled for training (0: all)
  int threads = 1;
  std::uint32_t seed = 1;
};

/// Trains a SentencePiece model into `out` (".model" file; the vocabulary
/// listing goes beside it as ".vocab"). Piece 0 is <unk>, 1 is </s> (the end
/// of document), no BOS. Throws std::runtime_error with the trainer's message.
void train_sentencepiece(const SentencePieceTraining& options, const std::string& out);

}  // namespace hp
