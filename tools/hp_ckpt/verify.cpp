// hp-ckpt verify: manifest.json against its checksum file, every shard
// against the manifest (file present, header agreeing with the manifest,
// byte range inside the file, checksum), every tensor's tiling, and
// state.json against the manifest. The first problem
// is reported in one line naming the file and the tensor.
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "checkpoint/detail/fs.h"
#include "checkpoint/error.h"
#include "hp/checkpoint/file_names.h"
#include "hp/checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "tools/hp_ckpt/hp_ckpt.h"

namespace hp::ckpt_tool {
namespace {

namespace fs = std::filesystem;

/// A problem verify found: the message is the whole report line.
class Bad : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// XXH64 of [begin, end) of the open file `fd`, read in bounded chunks.
std::string checksum_range(int fd, std::uint64_t begin, std::uint64_t end, const std::string& path,
                           const std::string& tensor) {
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> state(XXH64_createState(),
                                                                   &XXH64_freeState);
  XXH64_reset(state.get(), 0);
  std::vector<char> buf(std::size_t{4} << 20);
  std::uint64_t at = begin;
  while (at < end) {
    const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), end - at));
    const ssize_t got = ::pread(fd, buf.data(), want, static_cast<off_t>(at));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      throw Bad(path + ": tensor '" + tensor + "': cannot read bytes [" + std::to_string(at) +
                ", " + std::to_string(end) + ") (" +
                (got < 0 ? std::string(std::strerror(errno)) : "unexpected end of file") + ")");
    }
    XXH64_update(state.get(), buf.data(), static_cast<std::size_t>(got));
    at += static_cast<std::uint64_t>(got);
  }
  return ckpt::format_xxh64(XXH64_digest(state.get()));
}

struct ShardRef {
  std::string tensor;
  const ckpt::TensorRecord* record;
  const ckpt::ShardRecord* shard;
};

struct Counts {
  std::size_t tensors = 0, shards = 0, files = 0;
  std::uint64_t bytes = 0;
};

void verify_file(const fs::path& step_dir, const std::string& file,
                 const std::vector<ShardRef>& shards, Counts& counts) {
  const std::string path = (step_dir / file).string();
  const std::string first = shards.front().tensor;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    throw Bad(path + ": tensor '" + first + "': the shard file is missing (the manifest lists " +
              std::to_string(shards.size()) + " shard(s) in it)");
  }
  std::unique_ptr<ckpt::SafetensorsReader> reader;
  try {
    reader = std::make_unique<ckpt::SafetensorsReader>(path);
  } catch (const ckpt::CheckpointError& e) {
    throw Bad(path + ": tensor '" + first + "': " + e.what());
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw Bad(path + ": tensor '" + first + "': cannot open (" + std::strerror(errno) + ")");
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  for (const auto& ref : shards) {
    const auto& s = *ref.shard;
    const std::string where = path + ": tensor '" + ref.tensor + "': ";
    if (s.byte_end > reader->file_size()) {
      throw Bad(where + "the manifest's byte range [" + std::to_string(s.byte_begin) + ", " +
                std::to_string(s.byte_end) + ") reaches past the end of the file (" +
                std::to_string(reader->file_size()) + " bytes): the file is truncated");
    }
    if (!reader->has(ref.tensor)) {
      throw Bad(where +
                "the file's header has no entry for it, but the manifest lists a shard "
                "of it here");
    }
    const auto& e = reader->entry(ref.tensor);
    if (e.dtype != ref.record->dtype || e.shape != s.lengths || e.begin != s.byte_begin ||
        e.end != s.byte_end) {
      const auto dtype = [](at::ScalarType t) {
        const auto n = ckpt::safetensors_dtype_name(t);
        return n ? *n : std::string(c10::toString(t));
      };
      throw Bad(where + "the file's header says " + dtype(e.dtype) + " " + ckpt::detail::format_shape(e.shape) +
                " at bytes [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                ") but the manifest says " + dtype(ref.record->dtype) + " " +
                ckpt::detail::format_shape(s.lengths) + " at bytes [" + std::to_string(s.byte_begin) + ", " +
                std::to_string(s.byte_end) + ")");
    }
    const auto got = checksum_range(fd, s.byte_begin, s.byte_end, path, ref.tensor);
    if (got != s.xxh64) {
      throw Bad(where + "checksum mismatch (manifest " + s.xxh64 + ", bytes " + got +
                "): the shard's data is corrupt");
    }
    counts.shards += 1;
    counts.bytes += s.byte_end - s.byte_begin;
  }
  counts.files += 1;
}

/// The whole file at `path`; a file that cannot be opened is Bad.
std::string read_whole(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    throw Bad(path + ": cannot open (" + std::strerror(errno) + ")");
  }
  std::string text;
  char buf[65536];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  std::fclose(f);
  return text;
}

/// state.json against the manifest: its checksum (when the manifest has
/// one) and its step.
void verify_state(const fs::path& step_dir, const ckpt::Manifest& m, bool& checksummed) {
  const std::string path = (step_dir / "state.json").string();
  const std::string text = read_whole(path);
  checksummed = !m.state_xxh64.empty();
  if (checksummed) {
    const auto got = ckpt::format_xxh64(XXH64(text.data(), text.size(), 0));
    if (got != m.state_xxh64) {
      throw Bad(path + ": checksum mismatch (manifest " + m.state_xxh64 + ", file " + got +
                "): the run state was changed or damaged");
    }
  }
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    throw Bad(path + ": not valid JSON");
  }
  if (state.is_object() && state.contains("step") &&
      (!state["step"].is_number_integer() || state["step"].get<std::int64_t>() != m.step)) {
    throw Bad(path + ": it says step " + state["step"].dump().substr(0, 40) +
              " but the manifest says step " + std::to_string(m.step));
  }
}

/// config.yaml against the manifest's config_hash, when the manifest lists it.
void verify_config(const fs::path& step_dir, const ckpt::Manifest& m) {
  if (m.config_file.empty()) return;
  const std::string path = (step_dir / m.config_file).string();
  const std::string text = read_whole(path);
  const auto got = ckpt::xxh64_hex(text);
  if (got != m.config_hash) {
    throw Bad(path + ": checksum mismatch (manifest config_hash " + m.config_hash + ", file " +
              got + "): the stored config was changed or damaged");
  }
}

}  // namespace

int run_verify(const std::string& dir) {
  const std::string step_dir = resolve_step_dir(dir);
  const fs::path root(step_dir);
  const std::string manifest_path = (root / ckpt::kManifestFileName).string();
  try {
    const ckpt::Manifest m = ckpt::load_manifest(manifest_path);
    std::map<std::string, std::vector<ShardRef>> by_file;
    for (const auto& [name, t] : m.tensors) {
      const auto problem = ckpt::tiling_problem(t);
      if (!problem.empty()) {
        throw Bad(manifest_path + ": tensor '" + name +
                  "': its shards do not tile its global shape " + ckpt::detail::format_shape(t.global_shape) +
                  ": " + problem);
      }
      for (const auto& s : t.shards) by_file[s.file].push_back({name, &t, &s});
    }
    Counts counts;
    counts.tensors = m.tensors.size();
    for (const auto& [file, shards] : by_file) verify_file(root, file, shards, counts);
    bool checksummed = false;
    verify_state(root, m, checksummed);
    verify_config(root, m);
    std::printf(
        "OK %s: %s, step %lld, %zu tensors tile, %zu shards in %zu files (%llu bytes) match "
        "their checksums, state.json %s%s\n",
        step_dir.c_str(),
        m.checksum_file.empty() ? "manifest.json has no checksum in this older checkpoint"
                                : "manifest.json matches its checksum",
        static_cast<long long>(m.step), counts.tensors, counts.shards,
        counts.files, static_cast<unsigned long long>(counts.bytes),
        checksummed ? "matches its checksum" : "has no checksum in this older manifest",
        m.config_file.empty() ? "" : ", config.yaml matches its checksum");
    return 0;
  } catch (const Bad& e) {
    std::fprintf(stderr, "hp-ckpt verify: FAILED: %s\n", one_line(e.what()).c_str());
    return 1;
  } catch (const ckpt::CheckpointError& e) {
    std::fprintf(stderr, "hp-ckpt verify: FAILED: %s\n", one_line(e.what()).c_str());
    return 1;
  }
}

}  // namespace hp::ckpt_tool
