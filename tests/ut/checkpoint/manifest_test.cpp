// The manifest model: JSON round trip, version refusal, validation messages
// and the tiling rule commit enforces.
#include "hp/checkpoint/manifest.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "checkpoint/error.h"

namespace hp::ckpt::test {
namespace {

using nlohmann::json;

ShardRecord shard(std::vector<std::int64_t> offsets, std::vector<std::int64_t> lengths,
                  std::string file = "f.safetensors") {
  std::int64_t n = 4;
  for (auto l : lengths) {
    n *= l;
  }
  return ShardRecord{std::move(file),
                     std::move(offsets),
                     std::move(lengths),
                     100,
                     100 + static_cast<std::uint64_t>(n),
                     "00000000deadbeef"};
}

Manifest sample_manifest() {
  Manifest m;
  m.step = 100;
  m.layout = {{"pp", 2}, {"tp", 2}};
  m.config_hash = "abc123";
  TensorRecord t;
  t.global_shape = {8, 4};
  t.dtype = at::kFloat;
  t.shards = {shard({0, 0}, {5, 4}, "a.safetensors"), shard({5, 0}, {3, 4}, "b.safetensors")};
  m.tensors["layers.0.w"] = t;
  TensorRecord s;
  s.dtype = at::kInt;
  s.shards = {shard({}, {})};
  m.tensors["step_count"] = s;
  return m;
}

std::string parse_error(const json& j) {
  try {
    manifest_from_json(j, "/ckpt/manifest.json");
  } catch (const CheckpointError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a CheckpointError";
  return "";
}

}  // namespace

TEST(Manifest, JsonRoundTrip) {
  const Manifest m = sample_manifest();
  const json j = manifest_to_json(m);
  EXPECT_EQ(j["format_version"], 2);
  EXPECT_EQ(j["tensors"]["layers.0.w"]["dtype"], "F32");
  EXPECT_EQ(j["tensors"]["layers.0.w"]["shards"][1]["byte_range"], json({100, 148}));
  EXPECT_EQ(j["tensors"]["layers.0.w"]["shards"][1]["xxh64"], "00000000deadbeef");
  const Manifest back = manifest_from_json(json::parse(j.dump()), "mem");
  EXPECT_EQ(back.step, 100);
  EXPECT_EQ(back.layout, m.layout);
  EXPECT_EQ(back.config_hash, "abc123");
  ASSERT_EQ(back.tensors.size(), 2u);
  const auto& w = back.tensors.at("layers.0.w");
  EXPECT_EQ(w.global_shape, (std::vector<std::int64_t>{8, 4}));
  EXPECT_EQ(w.dtype, at::kFloat);
  ASSERT_EQ(w.shards.size(), 2u);
  EXPECT_EQ(w.shards[1].file, "b.safetensors");
  EXPECT_EQ(w.shards[1].offsets, (std::vector<std::int64_t>{5, 0}));
  EXPECT_EQ(w.shards[1].lengths, (std::vector<std::int64_t>{3, 4}));
  EXPECT_EQ(back.tensors.at("step_count").dtype, at::kInt);
  EXPECT_EQ(format_xxh64(0xabcULL), "0000000000000abc");
}

TEST(Manifest, RefusesAnotherFormatVersion) {
  json j = manifest_to_json(sample_manifest());
  j["format_version"] = 3;
  EXPECT_EQ(parse_error(j),
            "unknown checkpoint format version 3 in /ckpt/manifest.json; this hyperparallel "
            "reads versions 1 to 2: load it with the newer build that wrote it");
}

TEST(Manifest, ValidationNamesTheKeyAndTheFile) {
  json j = manifest_to_json(sample_manifest());
  j["tensors"]["layers.0.w"]["shards"][0].erase("xxh64");
  auto msg = parse_error(j);
  EXPECT_NE(msg.find("bad manifest /ckpt/manifest.json: tensors['layers.0.w'].shards[0].xxh64 "
                     "is missing"),
            std::string::npos)
      << msg;

  j = manifest_to_json(sample_manifest());
  j["tensors"]["layers.0.w"]["dtype"] = "C64";
  msg = parse_error(j);
  EXPECT_NE(msg.find("tensors['layers.0.w'].dtype is unknown: 'C64'"), std::string::npos) << msg;

  j = manifest_to_json(sample_manifest());
  j["tensors"]["layers.0.w"]["shards"][1]["offsets"] = {6, 0};
  msg = parse_error(j);
  EXPECT_NE(msg.find("reach past global shape [8, 4]"), std::string::npos) << msg;

  j = manifest_to_json(sample_manifest());
  j["tensors"]["layers.0.w"]["shards"][1]["byte_range"] = {100, 101};
  msg = parse_error(j);
  EXPECT_NE(msg.find("byte_range does not hold lengths [3, 4] of F32"), std::string::npos) << msg;

  j = manifest_to_json(sample_manifest());
  j["tensors"]["layers.0.w"]["shards"][1]["file"] = "../escape.safetensors";
  msg = parse_error(j);
  EXPECT_NE(msg.find("is not a plain file name"), std::string::npos) << msg;
}

TEST(Manifest, TilingProblems) {
  TensorRecord t;
  t.global_shape = {8, 6};
  t.shards = {shard({0, 0}, {8, 3}), shard({0, 3}, {8, 3})};
  EXPECT_EQ(tiling_problem(t), "");
  t.shards = {shard({0, 0}, {4, 6}), shard({3, 0}, {5, 6})};
  EXPECT_NE(tiling_problem(t).find("overlap"), std::string::npos) << tiling_problem(t);
  t.shards = {shard({0, 0}, {4, 6}), shard({5, 0}, {3, 6})};
  EXPECT_NE(tiling_problem(t).find("cover 42 of its 48 elements"), std::string::npos)
      << tiling_problem(t);
  EXPECT_NE(tiling_problem(t).find("gap"), std::string::npos);
  // Same element count as the whole, but an overlap hides a gap.
  t.shards = {shard({0, 0}, {4, 6}), shard({2, 0}, {2, 6}), shard({6, 0}, {2, 6})};
  EXPECT_NE(tiling_problem(t).find("overlap"), std::string::npos);
  // A 2 x 2 grid tiles; an empty tensor is tiled by an empty shard.
  t.shards = {shard({0, 0}, {3, 2}), shard({0, 2}, {3, 4}), shard({3, 0}, {5, 2}),
              shard({3, 2}, {5, 4})};
  EXPECT_EQ(tiling_problem(t), "");
  TensorRecord empty;
  empty.global_shape = {0, 3};
  empty.shards = {shard({0, 0}, {0, 3})};
  EXPECT_EQ(tiling_problem(empty), "");
}

}  // namespace hp::ckpt::test
