// How the run laid out each tensor ("placements" in a version-2 manifest,
// "split" in version 1): JSON round trip, version-1 manifests read as
// placements, manifests without it, validation, the writer recording it and
// commit refusing writers that disagree.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "tests/ut/checkpoint/test_util.h"

namespace hp::ckpt::test {
namespace {

using nlohmann::json;
using dist::Placement;

const dist::Placements kTpDp = {{"tp", Placement::shard(0)}, {"dp", Placement::shard(0)}};

Manifest split_manifest() {
  Manifest m;
  m.step = 4;
  m.layout = {{"tp", 2}};
  TensorRecord t;
  t.global_shape = {8, 4};
  t.shards = {ShardRecord{"a.safetensors", {0, 0}, {8, 4}, 100, 228, "00000000deadbeef"}};
  t.placements = kTpDp;
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

/// The same manifest as version 1 wrote it.
json version_1() {
  json j = manifest_to_json(split_manifest());
  j["format_version"] = 1;
  j["tensors"]["w"].erase("placements");
  j["tensors"]["w"]["split"] = {{"dim", 0}, {"groups", {"tp", "dp"}}};
  return j;
}

}  // namespace

TEST(ManifestSplit, JsonRoundTrip) {
  const json j = manifest_to_json(split_manifest());
  EXPECT_EQ(j["format_version"], 2);
  EXPECT_EQ(j["tensors"]["w"]["placements"],
            json::parse(R"J([{"dim": "tp", "placement": "S(0)"}, {"dim": "dp", "placement": "S(0)"}])J"));
  EXPECT_FALSE(j["tensors"]["b"].contains("placements"));
  EXPECT_FALSE(j["tensors"]["w"].contains("split"));
  const Manifest back = manifest_from_json(json::parse(j.dump()), "mem");
  EXPECT_EQ(back.tensors.at("w").placements, kTpDp);
  EXPECT_EQ(back.tensors.at("w").split_dim(), 0);
  EXPECT_EQ(back.tensors.at("w").split_groups(), (std::vector<std::string>{"tp", "dp"}));
  EXPECT_EQ(back.tensors.at("b").split_dim(), -1);
  EXPECT_TRUE(back.tensors.at("b").placements.empty());
}

TEST(ManifestSplit, AVersion1SplitIsReadAsShardPlacements) {
  const Manifest back = manifest_from_json(version_1(), "mem");
  EXPECT_EQ(back.format_version, 1);
  EXPECT_EQ(back.tensors.at("w").placements, kTpDp);
  // A version-2 manifest's "split" means nothing; a version-1 one's
  // "placements" neither.
  json j = manifest_to_json(split_manifest());
  j["tensors"]["b"]["split"] = {{"dim", 0}, {"groups", {"tp"}}};
  EXPECT_TRUE(manifest_from_json(j, "mem").tensors.at("b").placements.empty());
  j = version_1();
  j["tensors"]["b"]["placements"] = json::parse(R"J([{"dim": "tp", "placement": "S(0)"}])J");
  EXPECT_TRUE(manifest_from_json(j, "mem").tensors.at("b").placements.empty());
}

TEST(ManifestSplit, AnUnknownVersionIsRefusedNamingTheRange) {
  json j = manifest_to_json(split_manifest());
  j["format_version"] = 3;
  EXPECT_NE(parse_error(j).find("unknown checkpoint format version 3 in /ckpt/manifest.json; this hyperparallel "
                                "reads versions 1 to 2: load it with the newer build that wrote it"),
            std::string::npos)
      << parse_error(j);
  j["format_version"] = 0;
  EXPECT_NE(parse_error(j).find("reads versions 1 to 2"), std::string::npos) << parse_error(j);
}

TEST(ManifestSplit, OldManifestWithoutSplitLoads) {
  json j = version_1();
  j["tensors"]["w"].erase("split");
  const Manifest back = manifest_from_json(j, "mem");
  EXPECT_EQ(back.tensors.at("w").split_dim(), -1);
  EXPECT_TRUE(back.tensors.at("w").placements.empty());
}

TEST(ManifestSplit, InvalidSplitIsRefusedNamingTensor) {
  json j = version_1();
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

TEST(ManifestSplit, InvalidPlacementsAreRefusedNamingTensor) {
  json j = manifest_to_json(split_manifest());
  j["tensors"]["w"]["placements"][0]["placement"] = "S(2)";
  EXPECT_NE(parse_error(j).find("tensors['w'].placements is invalid: split dim 2 is outside [-1, 2)"),
            std::string::npos)
      << parse_error(j);
  j["tensors"]["w"]["placements"][0]["placement"] = "X(0)";
  EXPECT_NE(parse_error(j).find("tensors['w'].placements holds {\"dim\":\"tp\",\"placement\":\"X(0)\"}"),
            std::string::npos)
      << parse_error(j);
  j["tensors"]["w"]["placements"][0]["placement"] = "HT(0)";
  EXPECT_NE(parse_error(j).find("tp:HT(0) is not a layout a checkpoint holds"), std::string::npos)
      << parse_error(j);
  j["tensors"]["w"]["placements"][0] = {{"dim", "dp"}, {"placement", "S(0)"}};
  EXPECT_NE(parse_error(j).find("mesh dimension 'dp' is placed twice"), std::string::npos) << parse_error(j);
}

TEST(ManifestSplit, WriterRecordsSplitInTheCommittedManifest) {
  TempDir dir;
  const auto w = sample({8, 4}, at::kFloat);
  CheckpointWriter::prepare(dir.path(), 1);
  const dist::Placements tp = {{"tp", Placement::shard(0)}};
  for (int r = 0; r < 2; ++r) {
    CheckpointWriter writer(dir.path(), 1, r);
    writer.write_file(rank_file(r),
                      {{"w", w.narrow(0, 4 * r, 4).clone(), {8, 4}, {4 * r, 0}, tp},
                       {"b" + std::to_string(r), w[0].clone(), {4}, {0}}});
    writer.finish_rank();
  }
  CheckpointWriter::commit(dir.path(), 1, json{{"step", 1}}, {{"tp", 2}}, "h");
  const CheckpointReader reader(CheckpointReader::latest(dir.path()));
  EXPECT_EQ(reader.manifest().format_version, 2);
  EXPECT_EQ(reader.manifest().tensors.at("w").placements, tp);
  EXPECT_EQ(reader.manifest().tensors.at("b0").split_dim(), -1);
  EXPECT_TRUE(bitwise_equal(reader.read_full("w"), w));
}

TEST(ManifestSplit, WriterRefusesAnInvalidOrChangedSplit) {
  TempDir dir;
  CheckpointWriter::prepare(dir.path(), 1);
  CheckpointWriter writer(dir.path(), 1, 0);
  const auto t = sample({4}, at::kFloat);
  EXPECT_NE(error_of([&] {
              writer.write_file("a.safetensors", {{"w", t, {4}, {0}, {{"tp", Placement::shard(1)}}}});
            })
                .find("cannot write tensor 'w' to " + dir.path() +
                      "/step_00000001.tmp/a.safetensors: split dim 1 is outside [-1, 1)"),
            std::string::npos);
  writer.write_file("a.safetensors", {{"w", t, {4}, {0}, {{"tp", Placement::shard(0)}}}});
  EXPECT_NE(error_of([&] {
              writer.write_file("b.safetensors", {{"w", t, {4}, {0}, {{"ep", Placement::shard(0)}}}});
            }).find("already wrote it placed tp:S(0), now placed ep:S(0)"),
            std::string::npos);
}

TEST(ManifestSplit, CommitRefusesWritersThatDisagreeNamingTheTensor) {
  TempDir dir;
  const auto w = sample({8, 4}, at::kFloat);
  CheckpointWriter::prepare(dir.path(), 2);
  const std::vector<dist::Placements> placements = {{{"tp", Placement::shard(0)}}, kTpDp};
  for (int r = 0; r < 2; ++r) {
    CheckpointWriter writer(dir.path(), 2, r);
    writer.write_file(rank_file(r),
                      {{"layers.0.w", w.narrow(0, 4 * r, 4).clone(), {8, 4}, {4 * r, 0}, placements[r]}});
    writer.finish_rank();
  }
  const auto msg = error_of([&] {
    CheckpointWriter::commit(dir.path(), 2, json{{"step", 2}}, {{"tp", 2}}, "h");
  });
  EXPECT_NE(msg.find("internal error"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tensor 'layers.0.w' is placed tp:S(0) on rank 0 but placed tp:S(0) dp:S(0) on rank 1"),
            std::string::npos)
      << msg;
  EXPECT_TRUE(CheckpointReader::latest(dir.path()).empty());
}

}  // namespace hp::ckpt::test

namespace hp::ckpt::test {

// The run's mesh in a version-2 manifest: round trip, and a damaged one
// refused in one line naming the file and the problem.
TEST(ManifestMesh, RoundTripsAndABadOneIsRefusedNamingTheFile) {
  dist::MeshPlan plan;
  plan.claim("tp", 2, "tensor_parallel", dist::MeshRole::kSplit);
  plan.carve("ep", 2, "expert_parallel", dist::MeshRole::kSplit);
  dist::ProcessMesh mesh;
  dist::MeshProblem problem;
  ASSERT_TRUE(dist::resolve_mesh(plan, 8, 0, mesh, problem)) << problem.rule;
  Manifest m = split_manifest();
  m.mesh = std::make_shared<const dist::ProcessMesh>(mesh);
  const json j = manifest_to_json(m);
  const Manifest back = manifest_from_json(json::parse(j.dump()), "mem");
  ASSERT_TRUE(back.mesh);
  EXPECT_EQ(back.mesh->shape(), mesh.shape());
  EXPECT_EQ(back.mesh->order(), mesh.order());
  EXPECT_EQ(back.mesh->group_ranks("edp", 5), mesh.group_ranks("edp", 5));

  json bad = j;
  bad["mesh"]["dims"] = 3;
  EXPECT_EQ(parse_error(bad), "bad manifest /ckpt/manifest.json: mesh dims is not an array");
  bad = j;
  bad["mesh"]["dims"][0]["role"] = "sideways";
  EXPECT_NE(parse_error(bad).find("bad manifest /ckpt/manifest.json: mesh dims holds "), std::string::npos)
      << parse_error(bad);
  bad = j;
  bad["mesh"]["views"][0]["over"] = {"cp"};
  EXPECT_NE(parse_error(bad).find("bad manifest /ckpt/manifest.json: its mesh is not valid: view"), std::string::npos)
      << parse_error(bad);
}

}  // namespace hp::ckpt::test
