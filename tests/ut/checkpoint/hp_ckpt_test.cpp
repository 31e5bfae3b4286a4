// hp-ckpt run as a real subprocess: inspect, verify on a good directory and
// on every kind of damage, convert (re-cut, merge, refusals), consolidate,
// per-rank and import. Every failure must be one line naming the file (and
// the tensor where one is involved).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "checkpoint/checkpoint.h"
#include "tests/support/beside_executable.h"
#include "tests/ut/checkpoint/test_util.h"

namespace hp::ckpt::test {
namespace {

using nlohmann::json;

/// The resolved config the checkpoint stores (config.yaml).
const std::string kConfig = "model: {layers: 2}\n";

struct ToolRun {
  int code = -1;
  std::string out;
  std::string err;
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

ToolRun hp_ckpt(const std::vector<std::string>& args) {
  TempDir io;
  std::string cmd = quote(hp::test::beside_executable(HP_CKPT_BIN_REL));
  for (const auto& a : args) cmd += " " + quote(a);
  cmd += " >" + quote(io / "out") + " 2>" + quote(io / "err");
  const int status = std::system(cmd.c_str());
  ToolRun r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_bytes(io / "out");
  r.err = read_bytes(io / "err");
  return r;
}

std::string file_of(const char* kind, int rank) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-rank%05d.safetensors", kind, rank);
  return buf;
}

/// A committed step 30 of a tp=2 x dp=2 run (4 ranks, tp fastest): a weight
/// split over tp along dim 0, an embedding split over tp along dim 1, a whole
/// bias, and Adam-like state: a ZeRO slice over tp+dp and a whole one.
struct Sharded {
  TempDir dir;
  at::Tensor w = sample({8, 4}, at::kFloat, 1);
  at::Tensor b = sample({6}, at::kFloat, 2);
  at::Tensor embed = sample({4, 12}, at::kBFloat16, 3);
  at::Tensor m_w = sample({8, 4}, at::kFloat, 4);
  at::Tensor m_b = sample({6}, at::kFloat, 5);
  json state = {{"step", 30}, {"rng", "00ff"}, {"data", {{"step", 30}}}};

  Sharded() {
    const std::string root = dir.path();
    CheckpointWriter::prepare(root, 30);
    for (int r = 0; r < 4; ++r) {
      const int tp = r % 2, dp = r / 2;
      CheckpointWriter writer(root, 30, r);
      std::vector<ShardedTensor> model, optim;
      if (dp == 0) {
        model.push_back(
            {"blocks.0.w", w.narrow(0, 4 * tp, 4).clone(), {8, 4}, {4 * tp, 0}, {{"tp", dist::Placement::shard(0)}}});
      } else {
        model.push_back(
            {"embed", embed.narrow(1, 6 * tp, 6).clone(), {4, 12}, {0, 6 * tp}, {{"tp", dist::Placement::shard(1)}}});
      }
      if (r == 0) model.push_back({"blocks.0.b", b, {6}, {0}});
      if (r == 3) optim.push_back({"exp_avg/blocks.0.b", m_b, {6}, {0}});
      const int piece = tp * 2 + dp;
      optim.push_back({"exp_avg/blocks.0.w",
                       m_w.narrow(0, 2 * piece, 2).clone(),
                       {8, 4},
                       {2 * piece, 0},
                       {{"tp", dist::Placement::shard(0)}, {"dp", dist::Placement::shard(0)}}});
      writer.write_file(file_of("model", r), model);
      writer.write_file(file_of("optim", r), optim);
      writer.finish_rank();
    }
    CheckpointWriter::commit(root, 30, state, {{"pp", 1}, {"dp", 2}, {"tp", 2}, {"ep", 1}},
                             kConfig);
  }
  std::string step_dir() const { return dir / "step_00000030"; }
  std::string file(const std::string& name) const { return step_dir() + "/" + name; }
  std::map<std::string, at::Tensor> all() const {
    return {{"blocks.0.w", w},
            {"blocks.0.b", b},
            {"embed", embed},
            {"exp_avg/blocks.0.w", m_w},
            {"exp_avg/blocks.0.b", m_b}};
  }
  void edit_manifest(const std::function<void(json&)>& edit) const {
    json m = json::parse(read_bytes(file("manifest.json")));
    edit(m);
    write_manifest_resealed(step_dir(), m.dump(2));
  }
};

/// verify fails with exit 1 and one line naming `file` (and `tensor` if given).
void expect_verify_fails(const Sharded& ckpt, const std::string& file, const std::string& tensor,
                         const std::string& problem) {
  const ToolRun r = hp_ckpt({"verify", ckpt.dir.path()});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.rfind("hp-ckpt verify: FAILED: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(ckpt.file(file)), std::string::npos) << r.err;
  if (!tensor.empty()) EXPECT_NE(r.err.find("tensor '" + tensor + "'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(problem), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

}  // namespace

TEST(HpCkptInspect, TextNamesStepLayoutAndEveryTensorsSplit) {
  Sharded ckpt;
  const ToolRun r = hp_ckpt({"inspect", ckpt.dir.path()});  // the root: its latest step
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("checkpoint   " + ckpt.step_dir()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step         30 (format version 2)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layout       dp=2 ep=1 pp=1 tp=2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("config       config.yaml, xxh64 " + xxh64_hex(kConfig)), std::string::npos)
      << r.out;
  EXPECT_NE(
      r.out.find(
          "tensor              kind       global shape  dtype  bytes  placements       shards"),
      std::string::npos)
      << r.out;
  EXPECT_NE(
      r.out.find(
          "blocks.0.w          model      [8, 4]        F32      128  tp:S(0)               2"),
      std::string::npos)
      << r.out;
  EXPECT_NE(
      r.out.find(
          "embed               model      [4, 12]       BF16      96  tp:S(1)               2"),
      std::string::npos)
      << r.out;
  EXPECT_NE(
      r.out.find(
          "exp_avg/blocks.0.b  optimizer  [6]           F32       24  -                     1"),
      std::string::npos)
      << r.out;
  EXPECT_NE(
      r.out.find(
          "exp_avg/blocks.0.w  optimizer  [8, 4]        F32      128  tp:S(0) dp:S(0)       4"),
      std::string::npos)
      << r.out;
  EXPECT_NE(
      r.out.find(
          "total        5 tensors (3 model, 2 optimizer state), 400 bytes in 10 shards, 8 files"),
      std::string::npos)
      << r.out;
}

TEST(HpCkptInspect, JsonIsMachineReadable) {
  Sharded ckpt;
  const ToolRun r = hp_ckpt({"inspect", ckpt.step_dir(), "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["step"], 30);
  EXPECT_EQ(j["layout"], json({{"dp", 2}, {"ep", 1}, {"pp", 1}, {"tp", 2}}));
  EXPECT_EQ(j["config_hash"], xxh64_hex(kConfig));
  EXPECT_EQ(j["config_file"], "config.yaml");
  EXPECT_EQ(j["totals"], json({{"tensors", 5},
                               {"model_tensors", 3},
                               {"optimizer_tensors", 2},
                               {"bytes", 400},
                               {"shards", 10},
                               {"files", 8}}));
  const auto& t = j["tensors"];
  const auto it = std::find_if(t.begin(), t.end(),
                               [](const json& e) { return e["name"] == "exp_avg/blocks.0.w"; });
  ASSERT_NE(it, t.end());
  EXPECT_EQ((*it)["placements"],
            json::parse(R"J([{"dim": "tp", "placement": "S(0)"}, {"dim": "dp", "placement": "S(0)"}])J"));
  EXPECT_EQ((*it)["kind"], "optimizer");
  EXPECT_EQ((*it)["shards"], 4);
  EXPECT_EQ((*it)["global_shape"], json({8, 4}));
  EXPECT_EQ((*it)["dtype"], "F32");
  EXPECT_EQ((*it)["bytes"], 128);
  EXPECT_TRUE(t[0]["placements"].empty());  // blocks.0.b
}

TEST(HpCkptVerify, GoodDirectoryIsOneOkLine) {
  Sharded ckpt;
  const ToolRun r = hp_ckpt({"verify", ckpt.dir.path()});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out,
            "OK " + ckpt.step_dir() +
                ": manifest.json matches its checksum, step 30, 5 tensors tile, 10 shards in 8 files (400 bytes) match their "
                "checksums, state.json matches its checksum, config.yaml matches its checksum\n");
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST(HpCkptVerify, FlippedByteNamesFileAndTensor) {
  Sharded ckpt;
  const auto path = ckpt.file(file_of("model", 1));
  flip_byte(path, fs::file_size(path) - 3);
  expect_verify_fails(ckpt, file_of("model", 1), "blocks.0.w", "checksum mismatch");
}

TEST(HpCkptVerify, TruncatedFile) {
  Sharded ckpt;
  const auto path = ckpt.file(file_of("optim", 2));
  const auto bytes = read_bytes(path);
  write_bytes(path, bytes.substr(0, bytes.size() - 5));
  expect_verify_fails(ckpt, file_of("optim", 2), "exp_avg/blocks.0.w", "truncated");
}

TEST(HpCkptVerify, MissingShardFile) {
  Sharded ckpt;
  fs::remove(ckpt.file(file_of("optim", 2)));
  expect_verify_fails(ckpt, file_of("optim", 2), "exp_avg/blocks.0.w", "the shard file is missing");
}

TEST(HpCkptVerify, HeaderLyingAboutSizes) {
  Sharded ckpt;
  // Same header length, same data, but the header now claims a [2, 4] tensor.
  const auto path = ckpt.file(file_of("model", 1));
  std::string bytes = read_bytes(path);
  std::uint64_t len = 0;
  std::memcpy(&len, bytes.data(), 8);
  json header = json::parse(bytes.substr(8, len));
  auto& e = header["blocks.0.w"];
  e["shape"] = {2, 4};
  e["data_offsets"][1] = e["data_offsets"][0].get<std::uint64_t>() + 32;
  std::string text = header.dump();
  ASSERT_LE(text.size(), len);
  text.append(len - text.size(), ' ');
  bytes.replace(8, len, text);
  write_bytes(path, bytes);
  expect_verify_fails(ckpt, file_of("model", 1), "blocks.0.w", "the file's header says F32 [2, 4]");
}

TEST(HpCkptVerify, HeaderClaimingMoreThanTheFile) {
  Sharded ckpt;
  const auto path = ckpt.file(file_of("model", 0));
  std::string bytes = read_bytes(path);
  const std::uint64_t huge = 1ull << 40;
  std::memcpy(bytes.data(), &huge, 8);
  write_bytes(path, bytes);
  expect_verify_fails(ckpt, file_of("model", 0), "", "bad header length");
}

TEST(HpCkptVerify, EditedStateJson) {
  Sharded ckpt;
  std::string text = read_bytes(ckpt.file("state.json"));
  const auto at = text.find("\"step\": 30");
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, 10, "\"step\": 3");
  write_bytes(ckpt.file("state.json"), text);
  expect_verify_fails(ckpt, "state.json", "", "checksum mismatch");
}

// The manifest's checksum (manifest.json.xxh64): 50 positions drawn with a
// fixed seed, as ut.ManifestIntegrity flips them for the reader in-process;
// here every tenth is flipped alone, as an hp-ckpt process costs a second or
// more: verify refuses each in one line naming manifest.json and the fix,
// and accepts the file once restored.
TEST(HpCkptVerify, FlippedManifestBytesAreEachOneLine) {
  Sharded ckpt;
  const std::string path = ckpt.file("manifest.json");
  const std::string good = read_bytes(path);
  std::mt19937 rng(22);
  std::uniform_int_distribution<std::size_t> where(0, good.size() - 1);
  std::set<std::size_t> positions;
  while (positions.size() < 50) positions.insert(where(rng));
  std::size_t i = 0;
  for (const auto at : positions) {
    if (i++ % 10 != 0) continue;
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x5a);
    write_bytes(path, bad);
    SCOPED_TRACE("byte " + std::to_string(at));
    expect_verify_fails(ckpt, "manifest.json", "", "resume from another step");
  }
  write_bytes(path, good);
  EXPECT_EQ(hp_ckpt({"verify", ckpt.dir.path()}).code, 0);
}

TEST(HpCkptVerify, NewerFormatVersion) {
  Sharded ckpt;
  ckpt.edit_manifest([](json& m) { m["format_version"] = m["format_version"].get<int>() + 1; });
  expect_verify_fails(ckpt, "manifest.json", "", "unknown checkpoint format version 3");
  // inspect and convert refuse it the same way, in one line.
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"inspect", ckpt.dir.path()}, {"convert", ckpt.dir.path(), "--to", ckpt.dir / "out"}}) {
    const ToolRun r = hp_ckpt(args);
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(ckpt.file("manifest.json")), std::string::npos) << r.err;
  }
}

TEST(HpCkptVerify, TilingGapAndOverlapAreRefused) {
  {
    Sharded ckpt;
    ckpt.edit_manifest([](json& m) { m["tensors"]["blocks.0.w"]["shards"].erase(1); });
    expect_verify_fails(ckpt, "manifest.json", "blocks.0.w", "leaving a gap");
    const ToolRun r = hp_ckpt({"convert", ckpt.dir.path(), "--to", ckpt.dir / "out"});
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("the shards of tensor 'blocks.0.w' do not tile"), std::string::npos)
        << r.err;
  }
  {
    Sharded ckpt;
    ckpt.edit_manifest([](json& m) {
      m["tensors"]["blocks.0.w"]["shards"][1]["offsets"] = {2, 0};
    });
    expect_verify_fails(ckpt, "manifest.json", "blocks.0.w", "overlap");
  }
}

TEST(HpCkptConvert, RecutToTp4Dp2ReadsBackEqual) {
  Sharded ckpt;
  TempDir out;
  const ToolRun r =
      hp_ckpt({"convert", ckpt.dir.path(), "--to", out.path(), "--tp", "4", "--dp", "2"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("converted step 30 from layout dp=2 ep=1 pp=1 tp=2 to dp=2 ep=1 pp=1 tp=4"),
            std::string::npos)
      << r.out;
  const CheckpointReader reader(CheckpointReader::latest(out.path()));
  EXPECT_EQ(reader.step(), 30);
  EXPECT_EQ(reader.layout(), (Layout{{"pp", 1}, {"dp", 2}, {"tp", 4}, {"ep", 1}, {"edp", 2}}));
  EXPECT_EQ(reader.config_hash(), xxh64_hex(kConfig));
  EXPECT_EQ(reader.config_text(), kConfig);
  EXPECT_EQ(reader.state(), ckpt.state);
  for (const auto& [name, full] : ckpt.all()) {
    EXPECT_TRUE(bitwise_equal(reader.read_full(name), full)) << name;
  }
  const auto& t = reader.manifest().tensors;
  ASSERT_EQ(t.at("blocks.0.w").shards.size(), 4u);
  for (const auto& s : t.at("blocks.0.w").shards)
    EXPECT_EQ(s.lengths, (std::vector<std::int64_t>{2, 4}));
  EXPECT_EQ(t.at("embed").shards.size(), 4u);
  EXPECT_EQ(t.at("exp_avg/blocks.0.w").shards.size(), 8u);
  EXPECT_EQ(t.at("exp_avg/blocks.0.w").split_groups(), (std::vector<std::string>{"tp", "dp"}));
  EXPECT_EQ(t.at("blocks.0.b").shards.size(), 1u);
  EXPECT_EQ(t.at("blocks.0.b").split_dim(), -1);
  // Optimizer state stays in optim-* files; replicas (dp=1: ranks 4-7) share the writing.
  for (const auto& s : t.at("exp_avg/blocks.0.w").shards)
    EXPECT_EQ(s.file.rfind("optim-rank", 0), 0u);
  bool replica_wrote = false;
  for (int rank = 4; rank < 8; ++rank) {
    replica_wrote |= fs::exists(fs::path(reader.dir()) / file_of("model", rank));
  }
  EXPECT_TRUE(replica_wrote);
  EXPECT_EQ(hp_ckpt({"verify", out.path()}).code, 0);
}

TEST(HpCkptConvert, MergeToOneRank) {
  Sharded ckpt;
  TempDir out;
  const ToolRun r = hp_ckpt({"convert", ckpt.step_dir(), "--to", out.path()});
  ASSERT_EQ(r.code, 0) << r.err;
  const CheckpointReader reader(CheckpointReader::latest(out.path()));
  for (const auto& [name, record] : reader.manifest().tensors) {
    ASSERT_EQ(record.shards.size(), 1u) << name;
    EXPECT_EQ(record.shards[0].lengths, record.global_shape) << name;
    EXPECT_TRUE(bitwise_equal(reader.read_full(name), ckpt.all().at(name))) << name;
  }
  EXPECT_EQ(reader.layout(), (Layout{{"pp", 1}, {"dp", 1}, {"tp", 1}, {"ep", 1}, {"edp", 1}}));
}

// An uneven cut is the trainer's (the first size % parts pieces one
// longer, as a vocabulary over tp): tp=3 cuts 8 rows as 3, 3, 2, and the
// pieces put back together are the tensors, bitwise.
TEST(HpCkptConvert, AnUnevenCutIsTheTrainersAndRoundTrips) {
  Sharded ckpt;
  TempDir out, back;
  ToolRun r = hp_ckpt({"convert", ckpt.dir.path(), "--to", out.path(), "--tp", "3", "--dp", "2"});
  ASSERT_EQ(r.code, 0) << r.err;
  const CheckpointReader reader(CheckpointReader::latest(out.path()));
  std::vector<std::int64_t> rows;
  for (const auto& s : reader.manifest().tensors.at("blocks.0.w").shards) rows.push_back(s.lengths[0]);
  std::sort(rows.begin(), rows.end());
  EXPECT_EQ(rows, (std::vector<std::int64_t>{2, 3, 3}));
  r = hp_ckpt({"convert", out.path(), "--to", back.path()});
  ASSERT_EQ(r.code, 0) << r.err;
  const CheckpointReader merged(CheckpointReader::latest(back.path()));
  for (const auto& [name, t] : ckpt.all()) EXPECT_TRUE(bitwise_equal(merged.read_full(name), t)) << name;
}

// A cut into more parts than a dimension has elements is one line naming
// the tensor, its size, the groups and their product.
TEST(HpCkptConvert, MorePartsThanElementsIsOneLineNamingTensorSizeAndN) {
  Sharded ckpt;
  TempDir out;
  ToolRun r = hp_ckpt({"convert", ckpt.dir.path(), "--to", out.path(), "--tp", "9"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err,
            "hp-ckpt convert: cannot cut tensor 'blocks.0.w' for the target layout: its size 8 along dim 0 (split "
            "over tp) is smaller than tp=9 parts, so some ranks would hold nothing; choose sizes whose product is at "
            "most 8\n");
  r = hp_ckpt({"convert", ckpt.dir.path(), "--to", out.path(), "--tp", "2", "--dp", "5"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("tensor 'exp_avg/blocks.0.w' for the target layout: its size 8 along dim 0 "
                       "(split over tp+dp) is smaller than tp=2 x dp=5 = 10 parts"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(out / "latest"));
}

TEST(HpCkptConvert, UsageErrorsExit2) {
  Sharded ckpt;
  TempDir out;
  const std::vector<std::vector<std::string>> cases = {
      {},
      {"convert", ckpt.dir.path()},
      {"convert", ckpt.dir.path(), "--to", out.path(), "--consolidate", "--tp", "2"},
      {"convert", ckpt.dir.path(), "--to", out.path(), "--consolidate", "--per-rank"},
      {"convert", ckpt.dir.path(), "--to", out.path(), "--dp", "2", "--ep", "3"},
      {"convert", ckpt.dir.path(), "--to", out.path(), "--tp", "0"},
      {"convert", ckpt.dir.path(), "--to", out.path(), "--per-rank", "--pp", "2"},
      {"convert", ckpt.dir.path(), "--to", ckpt.dir.path()},  // step 30 is already there
      {"verify", ckpt.dir / "no-such-dir"},
      {"inspect", ckpt.dir.path(), "--bogus"},
  };
  std::vector<ToolRun> runs;
  for (const auto& args : cases) {
    runs.push_back(hp_ckpt(args));
    const ToolRun& r = runs.back();
    EXPECT_EQ(r.code, 2) << (args.empty() ? "" : args[0]) << ": " << r.err;
    EXPECT_FALSE(r.err.empty());
  }
  EXPECT_NE(runs[4].err.find("target layout: ep=3 dp=2: ep (claimed by expert_parallel) is carved "
                             "out of dp and must divide its size (legal: a ep size dividing 2)"),
            std::string::npos)
      << runs[4].err;
  EXPECT_NE(runs[6].err.find("--per-rank with --pp 2: pipeline stages hold blocks"), std::string::npos);
  EXPECT_EQ(hp_ckpt({"--help"}).code, 0);
}

TEST(HpCkptConvert, UnknownSplitGroupIsNamed) {
  Sharded ckpt;
  ckpt.edit_manifest([](json& m) { m["tensors"]["embed"]["placements"][0]["dim"] = "cp"; });
  const ToolRun r = hp_ckpt({"convert", ckpt.dir.path(), "--to", ckpt.dir / "out", "--tp", "2"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err,
            "hp-ckpt convert: cannot cut tensor 'embed': it is split over group 'cp', which "
            "hp-ckpt does not know (it knows tp, dp, pp, ep, edp)\n");
}

TEST(HpCkptHelp, SaysWhatImportAndPerRankWrite) {
  const ToolRun import = hp_ckpt({"import", "--help"});
  EXPECT_EQ(import.code, 0);
  EXPECT_NE(import.out.find("no RNG, data\nposition or optimizer state"), std::string::npos)
      << import.out;
  const ToolRun convert = hp_ckpt({"convert", "--help"});
  EXPECT_EQ(convert.code, 0);
  EXPECT_NE(convert.out.find("rank = (pp * dp_size + dp) * tp_size + tp"), std::string::npos)
      << convert.out;
}

// A dimension hp-ckpt has never heard of, registered by some feature and
// recorded in the manifest's mesh (here "xp", split, over 2 ranks, with a
// view "xv" refactoring it with dp): convert re-shards over it by name
// (--size xp=4), the target manifest records the new mesh, and the tensor
// reads back bitwise.
TEST(HpCkptConvert, ADimensionOnlyTheManifestsMeshKnowsReshards) {
  TempDir dir;
  const auto w = sample({8, 4}, at::kFloat);
  dist::MeshPlan plan;
  plan.claim("xp", 2, "some_feature", dist::MeshRole::kSplit);
  plan.view({"xv", {"xp", "dp"}, {{"xa", 0, dist::MeshRole::kSplit, "some_feature"}}, "some_feature"});
  dist::ProcessMesh mesh;
  dist::MeshProblem problem;
  ASSERT_TRUE(dist::resolve_mesh(plan, 2, 1, mesh, problem)) << problem.rule;
  const dist::Placements xp = {{"xp", dist::Placement::shard(0)}};
  CheckpointWriter::prepare(dir.path(), 5);
  for (int r = 0; r < 2; ++r) {
    CheckpointWriter writer(dir.path(), 5, r);
    writer.write_file(file_of("model", r), {{"w", w.narrow(0, 4 * r, 4).clone(), {8, 4}, {4 * r, 0}, xp}});
    writer.finish_rank();
  }
  CheckpointWriter::commit_with_mesh(dir.path(), 5, json{{"step", 5}}, mesh, kConfig);
  const std::string src = dir / "step_00000005";
  const json m = json::parse(read_bytes(src + "/manifest.json"));
  EXPECT_EQ(m["mesh"]["dims"][0]["name"], "xp");
  EXPECT_EQ(m["mesh"]["views"][0]["name"], "xv");

  const ToolRun r = hp_ckpt({"convert", src, "--to", dir / "out", "--size", "xp=4"});
  ASSERT_EQ(r.code, 0) << r.err;
  const CheckpointReader reader(dir / "out/step_00000005");
  const auto& t = reader.manifest().tensors.at("w");
  ASSERT_EQ(t.shards.size(), 4u);
  for (const auto& s : t.shards) EXPECT_EQ(s.lengths, (std::vector<std::int64_t>{2, 4}));
  EXPECT_EQ(t.placements, xp);
  ASSERT_TRUE(reader.manifest().mesh);
  EXPECT_EQ(reader.manifest().mesh->group_size("xp"), 4);
  EXPECT_EQ(reader.manifest().mesh->group_size("xa"), 4) << "the view's remainder follows";
  EXPECT_TRUE(bitwise_equal(reader.read_full("w"), w));

  const ToolRun unknown = hp_ckpt({"convert", src, "--to", dir / "out2", "--size", "cp=2"});
  EXPECT_EQ(unknown.code, 2);
  EXPECT_NE(unknown.err.find("unknown mesh dimension 'cp' (this layout has dp, edp, ep, pp, tp, xa, xp)"),
            std::string::npos)
      << unknown.err;
  const ToolRun bad = hp_ckpt({"convert", src, "--to", dir / "out2", "--size", "xp"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_EQ(bad.err, "hp-ckpt convert: --size xp: not NAME=N with N at least 1 (e.g. --size tp=2)\n");
}

TEST(HpCkptConvert, ConsolidateWritesFullModelWeightsAndConfig) {
  Sharded ckpt;
  TempDir out;
  const ToolRun r = hp_ckpt({"convert", ckpt.dir.path(), "--to", out / "full", "--consolidate"});
  ASSERT_EQ(r.code, 0) << r.err;
  const SafetensorsReader file(out / "full/model.safetensors");
  EXPECT_EQ(file.names().size(), 3u);  // no optimizer state
  for (const auto& name : {"blocks.0.w", "blocks.0.b", "embed"}) {
    EXPECT_TRUE(bitwise_equal(file.read(name), ckpt.all().at(name))) << name;
  }
  const json config = json::parse(read_bytes(out / "full/config.json"));
  EXPECT_EQ(config["step"], 30);
  EXPECT_EQ(config["state_step"], 30);
  EXPECT_EQ(config["config_hash"], xxh64_hex(kConfig));
  EXPECT_EQ(config["layout"]["tp"], 2);
  // A second consolidate into the same, non-empty, directory is refused.
  EXPECT_EQ(hp_ckpt({"convert", ckpt.dir.path(), "--to", out / "full", "--consolidate"}).code, 2);
}

TEST(HpCkptConvert, PerRankHoldsOnlyThatRanksSlices) {
  Sharded ckpt;
  TempDir out;
  const ToolRun r = hp_ckpt(
      {"convert", ckpt.dir.path(), "--to", out / "ranks", "--per-rank", "--tp", "2", "--dp", "2"});
  ASSERT_EQ(r.code, 0) << r.err;
  for (int rank = 0; rank < 4; ++rank) {
    char sub[64];
    std::snprintf(sub, sizeof sub, "ranks/rank%05d/model.safetensors", rank);
    const SafetensorsReader file(out / sub);
    const int tp = rank % 2;  // rank = dp * tp_size + tp
    EXPECT_EQ(file.names().size(), 3u);
    EXPECT_TRUE(bitwise_equal(file.read("blocks.0.w"), ckpt.w.narrow(0, 4 * tp, 4))) << rank;
    EXPECT_TRUE(bitwise_equal(file.read("embed"), ckpt.embed.narrow(1, 6 * tp, 6))) << rank;
    EXPECT_TRUE(bitwise_equal(file.read("blocks.0.b"), ckpt.b)) << rank;
    const json slices = json::parse(file.metadata().at("hp_slices"));
    EXPECT_EQ(slices["embed"]["offsets"], json({0, 6 * tp}));
    EXPECT_EQ(file.metadata().at("hp_rank"), std::to_string(rank));
  }
  const json config = json::parse(read_bytes(out / "ranks/config.json"));
  EXPECT_EQ(config["ranks"][3], json({{"rank", 3},
                                      {"dir", "rank00003"},
                                      {"pp", 0},
                                      {"dp", 1},
                                      {"tp", 1},
                                      {"ep", 0},
                                      {"edp", 1}}));
}

TEST(HpCkptImport, FullWeightsBecomeACommittedStepZero) {
  TempDir dir;
  const auto w = sample({5, 3}, at::kFloat, 11);
  const auto ids = sample({7}, at::kLong, 12);
  write_safetensors(dir / "weights.safetensors", {{"blocks.0.w", w}, {"ids", ids}});
  const ToolRun r = hp_ckpt({"import", dir / "weights.safetensors", "--to", dir / "root"});
  ASSERT_EQ(r.code, 0) << r.err;
  const CheckpointReader reader(CheckpointReader::latest(dir / "root"));
  EXPECT_EQ(reader.dir(), dir / "root/step_00000000");
  EXPECT_EQ(reader.step(), 0);
  EXPECT_EQ(reader.state()["step"], 0);
  EXPECT_FALSE(reader.state().contains("rng"));
  EXPECT_FALSE(reader.state().contains("scheduler"));
  EXPECT_TRUE(bitwise_equal(reader.read_full("blocks.0.w"), w));
  EXPECT_TRUE(bitwise_equal(reader.read_full("ids"), ids));
  EXPECT_EQ(reader.manifest().tensors.at("blocks.0.w").shards.size(), 1u);
  EXPECT_EQ(hp_ckpt({"verify", dir / "root"}).code, 0);
  // Not into a root that already holds checkpoints.
  const ToolRun again = hp_ckpt({"import", dir / "weights.safetensors", "--to", dir / "root"});
  EXPECT_EQ(again.code, 2);
  EXPECT_NE(again.err.find("already holds checkpoints"), std::string::npos) << again.err;
}

TEST(HpCkptImport, DamagedFileIsOneLineNamingIt) {
  TempDir dir;
  write_safetensors(dir / "weights.safetensors", {{"w", sample({64}, at::kFloat)}});
  const auto bytes = read_bytes(dir / "weights.safetensors");
  write_bytes(dir / "weights.safetensors", bytes.substr(0, bytes.size() - 9));
  const ToolRun r = hp_ckpt({"import", dir / "weights.safetensors", "--to", dir / "root"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(dir / "weights.safetensors"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tensor 'w'"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir / "root/latest"));
}

}  // namespace hp::ckpt::test
