// The SentencePiece adapter, built as its own shared library
// (libhp_sentencepiece.so) with a C interface, and opened by
// framework/data/tokenizer.cpp with dlopen(RTLD_LOCAL | RTLD_DEEPBIND).
//
// Why not link libsentencepiece into hp_framework: Debian's
// libsentencepiece.so.0 carries and exports its own copy of protobuf-lite.
// Next to LibTorch's libprotobuf in one global symbol scope, libprotobuf's
// start-up code bound to SentencePiece's copy and every program crashed at
// load. RTLD_LOCAL keeps SentencePiece's symbols out of the global scope
// and RTLD_DEEPBIND makes it resolve its own protobuf first.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

void set_error(const std::string& msg, char* err, std::size_t err_len) {
  if (!err || err_len == 0) return;
  std::strncpy(err, msg.c_str(), err_len - 1);
  err[err_len - 1] = '\0';
}

}  // namespace

extern "C" {

// A processor from a serialized model; nullptr and `err` on failure.
void* hp_spm_load(const char* blob, std::size_t len, char* err, std::size_t err_len) {
  auto* sp = new sentencepiece::SentencePieceProcessor();
  const auto status = sp->LoadFromSerializedProto(std::string_view(blob, len));
  if (!status.ok()) {
    set_error(status.ToString(), err, err_len);
    delete sp;
    return nullptr;
  }
  return sp;
}

void hp_spm_free(void* handle) { delete static_cast<sentencepiece::SentencePieceProcessor*>(handle); }

int hp_spm_piece_size(const void* handle) {
  return static_cast<const sentencepiece::SentencePieceProcessor*>(handle)->GetPieceSize();
}

int hp_spm_eos_id(const void* handle) {
  return static_cast<const sentencepiece::SentencePieceProcessor*>(handle)->eos_id();
}

// Whether piece `id` is a control or the unknown piece, and its text.
int hp_spm_is_special(const void* handle, int id) {
  const auto* sp = static_cast<const sentencepiece::SentencePieceProcessor*>(handle);
  return sp->IsControl(id) || sp->IsUnknown(id) ? 1 : 0;
}

const char* hp_spm_piece(const void* handle, int id) {
  return static_cast<const sentencepiece::SentencePieceProcessor*>(handle)->IdToPiece(id).c_str();
}

// Encodes into a malloc'ed array (*ids, *count) the caller frees with free().
int hp_spm_encode(const void* handle, const char* text, std::size_t len, std::int32_t** ids,
                  std::size_t* count, char* err, std::size_t err_len) {
  std::vector<int> out;
  const auto status =
      static_cast<const sentencepiece::SentencePieceProcessor*>(handle)->Encode(std::string_view(text, len), &out);
  if (!status.ok()) {
    set_error(status.ToString(), err, err_len);
    return 1;
  }
  *count = out.size();
  *ids = static_cast<std::int32_t*>(std::malloc(std::max<std::size_t>(1, out.size()) * sizeof(std::int32_t)));
  for (std::size_t i = 0; i < out.size(); ++i) (*ids)[i] = out[i];
  return 0;
}

// Encodes as hp_spm_encode, and gives the score of the best segmentation
// and its margin over the second best (n-best search; +inf when there is
// no other). Returns 2, ids still set, when the model has no n-best search
// (model_type bpe): its merges are decided per word without scores summed.
int hp_spm_encode_scored(const void* handle, const char* text, std::size_t len, std::int32_t** ids,
                         std::size_t* count, float* best, float* gap, char* err, std::size_t err_len) {
  const int rc = hp_spm_encode(handle, text, len, ids, count, err, err_len);
  if (rc != 0) return rc;
  const auto* sp = static_cast<const sentencepiece::SentencePieceProcessor*>(handle);
  sentencepiece::ImmutableNBestSentencePieceText nbest;
  if (!sp->NBestEncode(std::string_view(text, len), 2, nbest.mutable_proto()).ok() || nbest.nbests_size() == 0) {
    *best = 0;
    *gap = std::numeric_limits<float>::infinity();
    return 2;
  }
  *best = nbest.nbests(0).score();
  *gap = nbest.nbests_size() > 1 ? *best - nbest.nbests(1).score() : std::numeric_limits<float>::infinity();
  return 0;
}

// Decodes into a malloc'ed string (*text, *len) the caller frees with free().
int hp_spm_decode(const void* handle, const std::int32_t* ids, std::size_t count, char** text,
                  std::size_t* len, char* err, std::size_t err_len) {
  std::string out;
  const std::vector<int> in(ids, ids + count);
  const auto status = static_cast<const sentencepiece::SentencePieceProcessor*>(handle)->Decode(in, &out);
  if (!status.ok()) {
    set_error(status.ToString(), err, err_len);
    return 1;
  }
  *len = out.size();
  *text = static_cast<char*>(std::malloc(out.size() + 1));
  std::memcpy(*text, out.data(), out.size());
  (*text)[out.size()] = '\0';
  return 0;
}

// Trains with the trainer's named arguments (keys[i] = values[i]).
int hp_spm_train(const char* const* keys, const char* const* values, std::size_t n, unsigned seed, char* err,
                 std::size_t err_len) {
  std::unordered_map<std::string, std::string> args;
  for (std::size_t i = 0; i < n; ++i) args[keys[i]] = values[i];
  sentencepiece::SetRandomGeneratorSeed(seed);
  const auto status = sentencepiece::SentencePieceTrainer::Train(args);
  if (!status.ok()) {
    set_error(status.ToString(), err, err_len);
    return 1;
  }
  return 0;
}

}  // extern "C"
