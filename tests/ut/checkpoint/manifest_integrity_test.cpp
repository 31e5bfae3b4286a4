// The manifest's own checksum (manifest.json.xxh64): a byte flipped anywhere
// in manifest.json is refused by the reader in one line naming the file and
// the fix; so are a damaged or missing checksum file; a manifest written
// before checksums loads unchecked.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "checkpoint/checkpoint.h"
#include "tests/ut/checkpoint/test_util.h"

namespace hp::ckpt::test {
namespace {

using nlohmann::json;

std::string saved_step(const TempDir& dir) {
  save_whole(dir.path(), 6,
             {{"blocks.0.w", sample({8, 4}, at::kFloat, 1)}, {"embed", sample({16}, at::kFloat, 2)}},
             {{"step", 6}});
  return CheckpointReader::latest(dir.path());
}

/// The refusal of `step`'s load, checked to be one line naming `file` and
/// the fix.
void expect_refused(const std::string& step, const std::string& file, const std::string& why) {
  const std::string msg = error_of([&] { CheckpointReader r(step); });
  EXPECT_EQ(msg.find('\n'), std::string::npos) << why << ": " << msg;
  EXPECT_NE(msg.find(file), std::string::npos) << why << ": " << msg;
  EXPECT_NE(msg.find("resume from another step"), std::string::npos) << why << ": " << msg;
  EXPECT_LT(msg.size(), 400u) << why << ": " << msg;
}

TEST(ManifestIntegrity, CommitWritesTheChecksumBesideTheManifest) {
  TempDir dir;
  const std::string step = saved_step(dir);
  const std::string text = read_bytes(step + "/manifest.json");
  EXPECT_EQ(read_bytes(step + "/manifest.json.xxh64"), xxh64_hex(text) + "  manifest.json\n");
  EXPECT_EQ(json::parse(text)["checksum_file"], "manifest.json.xxh64");
  EXPECT_EQ(json::parse(text)["format_version"], 2);
  EXPECT_EQ(CheckpointReader(step).manifest().checksum_file, kManifestChecksumFile);
}

// 50 positions drawn with a fixed seed over the whole file, each flipped
// alone (XOR with a random non-zero byte), then put back.
TEST(ManifestIntegrity, FiftyFlippedBytesAreEachRefusedInOneLine) {
  TempDir dir;
  const std::string step = saved_step(dir);
  const std::string path = step + "/manifest.json";
  const std::string good = read_bytes(path);
  std::mt19937 rng(22);
  std::uniform_int_distribution<std::size_t> where(0, good.size() - 1);
  std::uniform_int_distribution<int> mask(1, 255);
  std::set<std::size_t> positions;
  while (positions.size() < 50) positions.insert(where(rng));
  for (const auto at : positions) {
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ mask(rng));
    write_bytes(path, bad);
    expect_refused(step, path, "byte " + std::to_string(at));
    EXPECT_NE(error_of([&] { CheckpointReader r(step); }).find("its xxh64 is"), std::string::npos);
  }
  write_bytes(path, good);
  EXPECT_EQ(CheckpointReader(step).step(), 6);
}

TEST(ManifestIntegrity, DamagedOrMissingChecksumFileIsRefused) {
  TempDir dir;
  const std::string step = saved_step(dir);
  const std::string sum = step + "/manifest.json.xxh64";
  const std::string good = read_bytes(sum);
  for (std::size_t at : {std::size_t{0}, std::size_t{15}, std::size_t{17}, good.size() - 1}) {
    flip_byte(sum, at);
    // A hex digit that became another hex digit is a mismatch, anything
    // else a malformed file: either way both names are in the line.
    expect_refused(step, step + "/manifest.json", "checksum byte " + std::to_string(at));
    write_bytes(sum, good);
  }
  fs::remove(sum);
  expect_refused(step, sum, "checksum file removed");
}

TEST(ManifestIntegrity, ManifestWithoutChecksumStillLoads) {
  TempDir dir;
  const std::string step = saved_step(dir);
  write_manifest_unchecked(step, json::parse(read_bytes(step + "/manifest.json")));
  const CheckpointReader r(step);
  EXPECT_EQ(r.step(), 6);
  EXPECT_EQ(r.manifest().checksum_file, "");
  EXPECT_TRUE(bitwise_equal(r.read_full("blocks.0.w"), sample({8, 4}, at::kFloat, 1)));
  // Damage such a manifest can only be found by parsing: still one line.
  std::string text = read_bytes(step + "/manifest.json");
  text[text.find("\"step\"") + 1] = '\xff';
  write_bytes(step + "/manifest.json", text);
  expect_refused(step, step + "/manifest.json", "unchecked manifest with a bad byte");
}

}  // namespace
}  // namespace hp::ckpt::test
