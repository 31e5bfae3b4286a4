// How the run split each tensor ("split" in the manifest): JSON round trip,
// old manifests without it, validation, the writer recording it and commit
// refusing writers that disagree.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "tests/ut/checkpoint/test_util.h"

namespace hp::ckpt::test {
namespace {

using nlohmann::json;

Manifest split_manifest() {
  Manifest m;
  m.step = 4;
  m.layout = {{"tp", 2}};
  TensorRecord t;
  t.global_shape = {8, 4};
  t.shards = {ShardRecord{"a.safetensors", {0, 0}, {8, 4}, 100, 228, "00000000deadbeef"}};
  t.split_dim = 0;
  t.split_groups = {"tp", "dp"};
  m.tensors["w"] = t;
  TensorRecord b;
  b.global_shape = {4};
  b.shards = {ShardRecord{"a.safetensors", {0}, {4}, 228, 244, "00000000deadbeef"}};
  m.tensors["b"] = b;
  return m;
}

std::string parse_error(const json& j) {
  return error_of([&] { manifest_from_json(j, "/ckpt/manifest.json"); });
}

}  // namespace

TEST(ManifestSplit, JsonRoundTrip) {
  const json j = manifest_to_json(split_manifest());
  EXPECT_EQ(j["tensors"]["w"]["split"], json({{"dim", 0}, {"groups", {"tp", "dp"}}}));
  EXPECT_FALSE(j["tensors"]["b"].contains("split"));
  const Manifest back = manifest_from_json(json::parse(j.dump()), "mem");
  EXPECT_EQ(back.tensors.at("w").split_dim, 0);
  EXPECT_EQ(back.tensors.at("w").split_groups, (std::vector<std::string>{"tp", "dp"}));
  EXPECT_EQ(back.tensors.at("b").split_dim, -1);
  EXPECT_TRUE(back.tensors.at("b").split_groups.empty());
}

TEST(ManifestSplit, OldManifestWithoutSplitLoads) {
  json j = manifest_to_json(split_manifest());
  j["tensors"]["w"].erase("split");
  const Manifest back = manifest_from_json(j, "mem");
  EXPECT_EQ(back.tensors.at("w").split_dim, -1);
  EXPECT_TRUE(back.tensors.at("w").split_groups.empty());
}

TEST(ManifestSplit, InvalidSplitIsRefusedNamingTensor) {
  json j = manifest_to_json(split_manifest());
  j["tensors"]["w"]["split"]["dim"] = 2;
  EXPECT_NE(parse_error(j).find("tensors['w'].split is invalid: split dim 2 is outside [-1, 2)"),
            std::string::npos)
      << parse_error(j);
  j["tensors"]["w"]["split"] = {{"dim", 0}, {"groups", json::array()}};
  EXPECT_NE(parse_error(j).find("split dim 0 but no split groups"), std::string::npos);
  j["tensors"]["w"]["split"] = {{"dim", -1}, {"groups", {"tp"}}};
  EXPECT_NE(parse_error(j).find("split dim -1 (whole) but split groups are given"),
            std::string::npos);
  j["tensors"]["w"]["split"] = {{"dim", 0}, {"groups", {1}}};
  EXPECT_NE(parse_error(j).find("tensors['w'].split.groups is not an array of group names"),
            std::string::npos);
  j["tensors"]["w"]["split"] = {{"groups", {"tp"}}};
  EXPECT_NE(parse_error(j).find("tensors['w'].split.dim is missing"), std::string::npos);
}

TEST(ManifestSplit, WriterRecordsSplitInTheCommittedManifest) {
  TempDir dir;
  const auto w = sample({8, 4}, at::kFloat);
  CheckpointWriter::prepare(dir.path(), 1);
  for (int r = 0; r < 2; ++r) {
    CheckpointWriter writer(dir.path(), 1, r);
    writer.write_file(rank_file(r),
                      {{"w", w.narrow(0, 4 * r, 4).clone(), {8, 4}, {4 * r, 0}, 0, {"tp"}},
                       {"b" + std::to_string(r), w[0].clone(), {4}, {0}}});
    writer.finish_rank();
  }
  CheckpointWriter::commit(dir.path(), 1, json{{"step", 1}}, {{"tp", 2}}, "h");
  const CheckpointReader reader(CheckpointReader::latest(dir.path()));
  EXPECT_EQ(reader.manifest().tensors.at("w").split_dim, 0);
  EXPECT_EQ(reader.manifest().tensors.at("w").split_groups, std::vector<std::string>{"tp"});
  EXPECT_EQ(reader.manifest().tensors.at("b0").split_dim, -1);
  EXPECT_TRUE(bitwise_equal(reader.read_full("w"), w));
}

TEST(ManifestSplit, WriterRefusesAnInvalidOrChangedSplit) {
  TempDir dir;
  CheckpointWriter::prepare(dir.path(), 1);
  CheckpointWriter writer(dir.path(), 1, 0);
  const auto t = sample({4}, at::kFloat);
  EXPECT_NE(error_of([&] {
              writer.write_file("a.safetensors", {{"w", t, {4}, {0}, 1, {"tp"}}});
            })
                .find("cannot write tensor 'w' to " + dir.path() +
                      "/step_00000001.tmp/a.safetensors: split dim 1 is outside [-1, 1)"),
            std::string::npos);
  writer.write_file("a.safetensors", {{"w", t, {4}, {0}, 0, {"tp"}}});
  EXPECT_NE(
      error_of([&] {
        writer.write_file("b.safetensors", {{"w", t, {4}, {0}, 0, {"ep"}}});
      }).find("already wrote it with split along dim 0 over tp, now split along dim 0 over ep"),
      std::string::npos);
}

TEST(ManifestSplit, CommitRefusesWritersThatDisagreeNamingTheTensor) {
  TempDir dir;
  const auto w = sample({8, 4}, at::kFloat);
  CheckpointWriter::prepare(dir.path(), 2);
  const std::vector<std::vector<std::string>> groups = {{"tp"}, {"tp", "dp"}};
  for (int r = 0; r < 2; ++r) {
    CheckpointWriter writer(dir.path(), 2, r);
    writer.write_file(
        rank_file(r),
        {{"layers.0.w", w.narrow(0, 4 * r, 4).clone(), {8, 4}, {4 * r, 0}, 0, groups[r]}});
    writer.finish_rank();
  }
  const auto msg = error_of([&] {
    CheckpointWriter::commit(dir.path(), 2, json{{"step", 2}}, {{"tp", 2}}, "h");
  });
  EXPECT_NE(msg.find("internal error"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tensor 'layers.0.w' is split along dim 0 over tp on rank 0 but split along "
                     "dim 0 over tp+dp on rank 1"),
            std::string::npos)
      << msg;
  EXPECT_TRUE(CheckpointReader::latest(dir.path()).empty());
}

}  // namespace hp::ckpt::test
