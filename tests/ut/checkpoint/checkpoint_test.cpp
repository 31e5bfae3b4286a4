// CheckpointWriter + CheckpointReader on real files: whole tensors, tensors
// split across several simulated ranks and read back under other layouts,
// every user-facing error, replacing a step and `keep`.
#include "checkpoint/checkpoint.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>

#include "tests/ut/checkpoint/test_util.h"

namespace hp::ckpt::test {
namespace {

using nlohmann::json;

#define EXPECT_HAS(text, part)                               \
  EXPECT_NE(std::string(text).find(part), std::string::npos) \
      << "missing \"" << (part) << "\" in: " << (text)

std::string step_dir(const TempDir& dir, std::int64_t step) {
  return dir / CheckpointWriter::step_dir_name(step);
}

}  // namespace

TEST(Checkpoint, WholeTensorsRoundTripBitwise) {
  TempDir dir;
  auto nan_payload = torch::tensor({1.0F, -0.0F, std::numeric_limits<float>::quiet_NaN()});
  const std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"embed.weight", sample({7, 5}, at::kFloat)},
      {"lm_head.weight", sample({5, 7}, at::kBFloat16)},
      {"norm.scale", sample({5}, at::kHalf)},
      {"mask", sample({3, 3}, at::kBool)},
      {"step", torch::scalar_tensor(41, torch::kLong)},
      {"empty", torch::zeros({0, 4}, torch::kDouble)},
      {"special", nan_payload},
  };
  const json state = {{"rng", {1, 2, 3}}, {"data", {{"epoch", 2}, {"position", 1234}}}};
  CheckpointWriter::prepare(dir.path(), 100);
  CheckpointWriter w(dir.path(), 100, 0);
  EXPECT_EQ(w.staging_dir(), dir / "step_00000100.tmp");
  std::vector<ShardedTensor> shards;
  for (const auto& [name, t] : tensors) {
    shards.push_back({name, t, t.sizes().vec(), std::vector<std::int64_t>(t.dim(), 0)});
  }
  w.write_file("model-rank00000.safetensors", shards);
  w.finish_rank();
  const std::string config = "model: {layers: 77}\n";
  CheckpointWriter::commit(dir.path(), 100, state, {{"pp", 1}, {"dp", 1}, {"tp", 1}}, config);

  EXPECT_EQ(read_bytes(dir / "latest"), "step_00000100\n");
  EXPECT_FALSE(fs::exists(dir / "step_00000100.tmp"));
  EXPECT_FALSE(fs::exists(step_dir(dir, 100) + "/shards-rank00000.json"));
  ASSERT_EQ(CheckpointReader::latest(dir.path()), step_dir(dir, 100));
  CheckpointReader r(CheckpointReader::latest(dir.path()));
  EXPECT_EQ(r.step(), 100);
  EXPECT_EQ(r.state(), state);
  EXPECT_EQ(r.layout(), (Layout{{"pp", 1}, {"dp", 1}, {"tp", 1}}));
  EXPECT_EQ(r.config_hash(), xxh64_hex(config));
  EXPECT_EQ(r.config_text(), config);
  EXPECT_EQ(r.tensor_names().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(r.has(name)) << name;
    EXPECT_EQ(r.global_shape(name), t.sizes().vec()) << name;
    EXPECT_EQ(r.dtype(name), t.scalar_type()) << name;
    EXPECT_TRUE(bitwise_equal(r.read_full(name), t)) << name;
    EXPECT_NO_THROW(r.check(name, t.sizes(), t.scalar_type()));
  }
  EXPECT_FALSE(r.has("nope"));

  // The shard file is an ordinary safetensors file, manifest.json says where each tensor is.
  SafetensorsReader st(step_dir(dir, 100) + "/model-rank00000.safetensors");
  EXPECT_EQ(st.metadata().at("format"), "pt");
  EXPECT_TRUE(bitwise_equal(st.read("embed.weight"), tensors[0].second));
  const json m = json::parse(read_bytes(step_dir(dir, 100) + "/manifest.json"));
  EXPECT_EQ(m["format_version"], 2);
  EXPECT_EQ(m["step"], 100);
  EXPECT_EQ(m["config_hash"], xxh64_hex(config));
  EXPECT_EQ(m["config_file"], "config.yaml");
  EXPECT_EQ(read_bytes(step_dir(dir, 100) + "/config.yaml"), config);
  const auto& s = m["tensors"]["embed.weight"]["shards"][0];
  EXPECT_EQ(s["file"], "model-rank00000.safetensors");
  EXPECT_EQ(s["offsets"], json({0, 0}));
  EXPECT_EQ(s["lengths"], json({7, 5}));
  EXPECT_EQ(s["byte_range"][0].get<std::uint64_t>(), st.entry("embed.weight").begin);
  EXPECT_EQ(s["xxh64"].get<std::string>().size(), 16u);
  EXPECT_EQ(json::parse(read_bytes(step_dir(dir, 100) + "/state.json")), state);
}

TEST(Checkpoint, NoLatestMeansNoCheckpoint) {
  TempDir dir;
  EXPECT_EQ(CheckpointReader::latest(dir.path()), "");
  EXPECT_EQ(CheckpointReader::latest(dir / "does-not-exist"), "");
}

struct SplitCase {
  std::string label;
  std::int64_t dim;
  std::vector<std::int64_t> bounds;
};

class SplitAcrossRanks : public ::testing::TestWithParam<SplitCase> {};

TEST_P(SplitAcrossRanks, ReadsWholeAndAnyRegion) {
  const auto& c = GetParam();
  TempDir dir;
  const auto global = sample({9, 10}, at::kFloat, 3);
  write_split(dir.path(), 5, "w", global, c.dim, c.bounds);
  CheckpointWriter::commit(dir.path(), 5, json::object(), {{"tp", 4}}, "h");

  CheckpointReader r(CheckpointReader::latest(dir.path()));
  EXPECT_EQ(r.manifest().tensors.at("w").shards.size(), c.bounds.size() - 1);
  EXPECT_TRUE(bitwise_equal(r.read_full("w"), global));
  // A region that spans every shard boundary, then many arbitrary ones.
  EXPECT_TRUE(bitwise_equal(r.read("w", {1, 1}, {7, 8}), global.narrow(0, 1, 7).narrow(1, 1, 8)));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(99);
  for (int i = 0; i < 40; ++i) {
    const auto pick = torch::randint(0, 1 << 20, {4}, gen, torch::kLong);
    const std::int64_t o0 = pick[0].item<std::int64_t>() % 9;
    const std::int64_t o1 = pick[1].item<std::int64_t>() % 10;
    const std::int64_t l0 = pick[2].item<std::int64_t>() % (9 - o0 + 1);
    const std::int64_t l1 = pick[3].item<std::int64_t>() % (10 - o1 + 1);
    EXPECT_TRUE(
        bitwise_equal(r.read("w", {o0, o1}, {l0, l1}), global.narrow(0, o0, l0).narrow(1, o1, l1)))
        << "offsets " << o0 << "," << o1 << " lengths " << l0 << "," << l1;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, SplitAcrossRanks,
                         ::testing::Values(SplitCase{"Dim0TwoEven", 0, {0, 5, 9}},
                                           SplitCase{"Dim0FourUneven", 0, {0, 1, 4, 5, 9}},
                                           SplitCase{"Dim1TwoUneven", 1, {0, 7, 10}},
                                           SplitCase{"Dim1ThreeUneven", 1, {0, 2, 3, 10}},
                                           SplitCase{"Dim1FourEven", 1, {0, 3, 5, 8, 10}},
                                           SplitCase{"Dim0WithEmptyShard", 0, {0, 4, 4, 9}}),
                         [](const auto& info) { return info.param.label; });

TEST(Checkpoint, GridWrittenOneWayIsReadAnotherWay) {
  // Written by 4 ranks as a 2 x 2 grid (tp along dim 1, pp along dim 0),
  // read by 3 ranks that each want a block of rows: any layout to any layout.
  TempDir dir;
  const auto global = sample({6, 8}, at::kBFloat16, 5);
  const auto bias = sample({8}, at::kFloat, 6);
  CheckpointWriter::prepare(dir.path(), 1);
  const std::int64_t rows[] = {0, 2, 6};
  const std::int64_t cols[] = {0, 5, 8};
  for (int r = 0; r < 4; ++r) {
    const int i = r / 2;
    const int j = r % 2;
    CheckpointWriter w(dir.path(), 1, r);
    std::vector<ShardedTensor> mine = {
        {"w",
         global.narrow(0, rows[i], rows[i + 1] - rows[i]).narrow(1, cols[j], cols[j + 1] - cols[j]),
         {6, 8},
         {rows[i], cols[j]}}};
    if (i == 0) {
      mine.push_back({"b", bias.narrow(0, cols[j], cols[j + 1] - cols[j]), {8}, {cols[j]}});
    }
    w.write_file(rank_file(r), mine);
    w.finish_rank();
  }
  CheckpointWriter::commit(dir.path(), 1, json::object(), {{"pp", 2}, {"tp", 2}}, "h");

  CheckpointReader r(CheckpointReader::latest(dir.path()));
  std::vector<at::Tensor> parts;
  for (const auto& [begin, len] :
       std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 3}, {3, 1}, {4, 2}}) {
    parts.push_back(r.read("w", {begin, 0}, {len, 8}));
  }
  EXPECT_TRUE(bitwise_equal(torch::cat(parts, 0), global));
  EXPECT_TRUE(bitwise_equal(r.read("w", {1, 4}, {2, 2}), global.narrow(0, 1, 2).narrow(1, 4, 2)));
  EXPECT_TRUE(bitwise_equal(r.read_full("b"), bias));
}

TEST(Checkpoint, OneFullFileIsSplitOnRead) {
  // "Online weight split": a whole tensor written by one rank, read by 4 tp ranks.
  TempDir dir;
  const auto w = sample({8, 12}, at::kFloat, 8);
  save_whole(dir.path(), 3, {{"w", w}}, json::object());
  CheckpointReader r(CheckpointReader::latest(dir.path()));
  for (int tp = 0; tp < 4; ++tp) {
    EXPECT_TRUE(bitwise_equal(r.read("w", {0, 3 * tp}, {8, 3}), w.narrow(1, 3 * tp, 3)));
  }
}

TEST(Checkpoint, ReadsOnlyTheShardsARegionOverlaps) {
  TempDir dir;
  const auto global = sample({8, 4}, at::kFloat, 9);
  write_split(dir.path(), 1, "w", global, 0, {0, 4, 8});
  CheckpointWriter::commit(dir.path(), 1, json::object(), {}, "");
  const auto step = CheckpointReader::latest(dir.path());
  CheckpointReader r(step);
  const auto& second = r.manifest().tensors.at("w").shards.at(1);
  ASSERT_EQ(second.file, rank_file(1));
  flip_byte(step + "/" + second.file, second.byte_begin + 3);
  EXPECT_TRUE(bitwise_equal(r.read("w", {0, 0}, {4, 4}), global.narrow(0, 0, 4)));
  const auto msg = error_of([&] { r.read("w", {3, 0}, {2, 4}); });
  EXPECT_HAS(msg, "checksum mismatch in " + step + "/" + rank_file(1) + " for tensor w");
}

TEST(Checkpoint, FlippedByteIsAChecksumMismatch) {
  TempDir dir;
  save_whole(dir.path(), 2,
             {{"a", sample({4}, at::kFloat)}, {"layer.w", sample({16, 16}, at::kFloat)}},
             json::object());
  const auto step = CheckpointReader::latest(dir.path());
  CheckpointReader r(step);
  const auto& s = r.manifest().tensors.at("layer.w").shards.at(0);
  const std::string file = step + "/model-rank00000.safetensors";
  flip_byte(file, s.byte_begin + 100);
  const auto msg = error_of([&] { r.read_full("layer.w"); });
  EXPECT_HAS(
      msg, "checksum mismatch in " + file + " for tensor layer.w (expected " + s.xxh64 + ", got ");
  EXPECT_HAS(msg, "): the checkpoint is corrupt");
  EXPECT_NO_THROW(r.read_full("a"));
}

// The run state is protected like the tensors: an edited step (30 -> 3) or a
// damaged state.json is refused with one short line, not silently resumed.
TEST(Checkpoint, EditedOrDamagedStateIsRefusedInOneLine) {
  TempDir dir;
  json state = {{"step", 30}, {"rng", std::string(5000, 'a')}};
  save_whole(dir.path(), 30, {{"w", sample({4}, at::kFloat)}}, state);
  const auto step = CheckpointReader::latest(dir.path());
  const std::string file = step + "/state.json";
  const std::string good = read_bytes(file);
  EXPECT_NO_THROW(CheckpointReader{step});
  std::string edited = good;
  edited.replace(edited.find("30"), 2, " 3");
  write_bytes(file, edited);
  auto msg = error_of([&] { CheckpointReader r(step); });
  EXPECT_HAS(msg, "bad state file " + file + ": its checksum is ");
  EXPECT_HAS(msg, "the run state was changed or damaged; resume from another step");
  EXPECT_EQ(msg.find('\n'), std::string::npos);
  write_bytes(file, good.substr(0, good.size() / 2));
  msg = error_of([&] { CheckpointReader r(step); });
  EXPECT_HAS(msg, "the run state was changed or damaged");
  EXPECT_LT(msg.size(), 400u) << "no blob in the message";
  // A manifest written before the checksum existed: the step still has to agree.
  json m = json::parse(read_bytes(step + "/manifest.json"));
  m.erase("state_xxh64");
  write_manifest_unchecked(step, m);
  write_bytes(file, edited);
  msg = error_of([&] { CheckpointReader r(step); });
  EXPECT_HAS(msg, "bad state file " + file +
                      ": it says step 3 but the manifest says step 30; resume from another step");
  write_bytes(file, good.substr(0, good.size() / 2));
  msg = error_of([&] { CheckpointReader r(step); });
  EXPECT_HAS(msg, "bad state file " + file + ": not valid JSON");
  EXPECT_LT(msg.size(), 400u) << "the parser's quote of kilobytes of RNG state is cut";
}

// The stored config is protected like the run state: an edited config.yaml
// is refused in one line; a manifest written before configs were stored
// (no config_file) reads with no config.
TEST(Checkpoint, StoredConfigIsChecksummedAndOptional) {
  TempDir dir;
  save_whole(dir.path(), 4, {{"w", sample({4}, at::kFloat)}}, {{"step", 4}});
  const auto step = CheckpointReader::latest(dir.path());
  EXPECT_EQ(CheckpointReader(step).config_text(), "hash-1");
  write_bytes(step + "/config.yaml", "hash-2");
  const auto msg = error_of([&] { CheckpointReader r(step); });
  EXPECT_HAS(msg, "bad config file " + step + "/config.yaml: its checksum is " +
                      xxh64_hex("hash-2") + " but the manifest's config_hash is " +
                      xxh64_hex("hash-1"));
  EXPECT_EQ(msg.find('\n'), std::string::npos);
  json m = json::parse(read_bytes(step + "/manifest.json"));
  m.erase("config_file");
  m["config_hash"] = "12345678901234567890";  // what std::hash of the model keys used to give
  write_manifest_unchecked(step, m);
  const CheckpointReader old(step);
  EXPECT_EQ(old.config_text(), "");
  EXPECT_EQ(old.config_hash(), "12345678901234567890");
  // A commit without a config writes none.
  CheckpointWriter::prepare(dir.path(), 5);
  CheckpointWriter w(dir.path(), 5, 0);
  w.write_file("model-rank00000.safetensors", {{"w", sample({4}, at::kFloat), {4}, {0}}});
  w.finish_rank();
  CheckpointWriter::commit(dir.path(), 5, {{"step", 5}}, {{"dp", 1}}, "");
  EXPECT_FALSE(fs::exists(step_dir(dir, 5) + "/config.yaml"));
  EXPECT_FALSE(
      json::parse(read_bytes(step_dir(dir, 5) + "/manifest.json")).contains("config_file"));
  EXPECT_EQ(CheckpointReader(step_dir(dir, 5)).config_text(), "");
}

TEST(Checkpoint, TruncatedShardFile) {
  TempDir dir;
  save_whole(dir.path(), 2, {{"w", sample({16, 16}, at::kFloat)}}, json::object());
  const auto step = CheckpointReader::latest(dir.path());
  const std::string file = step + "/model-rank00000.safetensors";
  fs::resize_file(file, fs::file_size(file) - 10);
  CheckpointReader r(step);
  const auto msg = error_of([&] { r.read_full("w"); });
  EXPECT_HAS(msg, "cannot read tensor 'w' from " + file);
  EXPECT_HAS(msg, "safetensors file " + file + " is truncated");
}

TEST(Checkpoint, UnknownFormatVersionIsRefused) {
  TempDir dir;
  save_whole(dir.path(), 2, {{"w", torch::ones({2})}}, json::object());
  const auto step = CheckpointReader::latest(dir.path());
  const std::string manifest = step + "/manifest.json";
  json m = json::parse(read_bytes(manifest));
  m["format_version"] = 7;
  write_manifest_resealed(step, m.dump());
  EXPECT_EQ(error_of([&] { CheckpointReader r(step); }),
            "unknown checkpoint format version 7 in " + manifest +
                "; this hyperparallel reads versions 1 to 2: load it with the newer build that wrote it");
}

TEST(Checkpoint, CheckNamesTensorShapesDtypesAndFile) {
  TempDir dir;
  save_whole(dir.path(), 2, {{"blocks.0.attn.qkv", sample({12, 4}, at::kFloat)}}, json::object());
  const auto step = CheckpointReader::latest(dir.path());
  CheckpointReader r(step);
  auto msg = error_of([&] { r.check("blocks.0.attn.qkv", {4, 4}, at::kFloat); });
  EXPECT_EQ(msg, "tensor 'blocks.0.attn.qkv' in checkpoint " + step +
                     "/manifest.json (stored in model-rank00000.safetensors) has shape [12, 4] "
                     "and dtype F32, but the model expects shape [4, 4] and dtype F32");
  msg = error_of([&] { r.check("blocks.0.attn.qkv", {12, 4}, at::kBFloat16); });
  EXPECT_HAS(msg, "and dtype F32, but the model expects shape [12, 4] and dtype BF16");
  msg = error_of([&] { r.check("blocks.9.mlp", {1}, at::kFloat); });
  EXPECT_HAS(msg, "tensor 'blocks.9.mlp' is not in checkpoint " + step + "/manifest.json");
  msg = error_of([&] { r.read("blocks.0.attn.qkv", {10, 0}, {3, 4}); });
  EXPECT_HAS(msg, "region offsets [10, 0] lengths [3, 4] of tensor 'blocks.0.attn.qkv'");
  EXPECT_HAS(msg, "not inside its global shape [12, 4]");
}

TEST(Checkpoint, LatestNamingAMissingDirectory) {
  TempDir dir;
  save_whole(dir.path(), 1, {{"w", torch::ones({2})}}, json::object());
  write_bytes(dir / "latest", "step_00000007\n");
  const auto msg = error_of([&] { CheckpointReader::latest(dir.path()); });
  EXPECT_HAS(msg, dir / "latest" + " names step_00000007, but " + (dir / "step_00000007") +
                      " does not exist");
  write_bytes(dir / "latest", "../../etc\n");
  EXPECT_HAS(error_of([&] { CheckpointReader::latest(dir.path()); }), "is malformed");
  EXPECT_HAS(error_of([&] { CheckpointReader r(dir / "step_00000042"); }),
             "checkpoint directory " + (dir / "step_00000042") + " does not exist");
}

TEST(Checkpoint, OverlappingShardsAreRefusedAtCommit) {
  TempDir dir;
  const auto global = sample({8, 4}, at::kFloat);
  write_split(dir.path(), 1, "layers.3.w", global, 0, {0, 5, 8});
  // A third rank that covers rows 4..5 again.
  CheckpointWriter w(dir.path(), 1, 2);
  w.write_file(rank_file(2), {{"layers.3.w", global.narrow(0, 4, 2), {8, 4}, {4, 0}}});
  w.finish_rank();
  const auto msg = error_of([&] { CheckpointWriter::commit(dir.path(), 1, {}, {}, ""); });
  EXPECT_HAS(msg, "internal error");
  EXPECT_HAS(msg, "the shards of tensor 'layers.3.w' do not tile its global shape [8, 4]");
  EXPECT_HAS(msg, "overlap");
  EXPECT_THROW(CheckpointWriter::commit(dir.path(), 1, {}, {}, ""), CheckpointInternalError);
  EXPECT_FALSE(fs::exists(dir / "latest"));
  EXPECT_FALSE(fs::exists(step_dir(dir, 1)));
}

TEST(Checkpoint, GappedShardsAreRefusedAtCommit) {
  TempDir dir;
  const auto global = sample({8, 6}, at::kFloat);
  CheckpointWriter::prepare(dir.path(), 1);
  CheckpointWriter w0(dir.path(), 1, 0);
  w0.write_file(rank_file(0), {{"emb", global.narrow(1, 0, 2), {8, 6}, {0, 0}}});
  w0.finish_rank();
  CheckpointWriter w1(dir.path(), 1, 1);
  w1.write_file(rank_file(1), {{"emb", global.narrow(1, 3, 3), {8, 6}, {0, 3}}});
  w1.finish_rank();
  try {
    CheckpointWriter::commit(dir.path(), 1, {}, {}, "");
    FAIL() << "expected CheckpointInternalError";
  } catch (const CheckpointInternalError& e) {
    EXPECT_HAS(e.what(), "tensor 'emb'");
    EXPECT_HAS(e.what(), "cover 40 of its 48 elements");
    EXPECT_HAS(e.what(), "gap");
  }
  EXPECT_EQ(CheckpointReader::latest(dir.path()), "");
}

TEST(Checkpoint, CommitChecksEveryRankFinished) {
  TempDir dir;
  CheckpointWriter::prepare(dir.path(), 1);
  for (int r : {0, 2}) {
    CheckpointWriter w(dir.path(), 1, r);
    w.finish_rank();
  }
  CheckpointWriter forgetful(dir.path(), 1, 1);
  EXPECT_HAS(error_of([&] { CheckpointWriter::commit(dir.path(), 1, {}, {}, ""); }),
             "shards-rank00001.json is missing");
  EXPECT_HAS(error_of([&] { CheckpointWriter::commit(dir.path(), 9, {}, {}, ""); }),
             "staging directory " + (dir / "step_00000009.tmp") + " does not exist");
}

TEST(Checkpoint, WriterRefusesShardsThatDoNotFit) {
  TempDir dir;
  CheckpointWriter w(dir.path(), 1, 0);
  auto msg = error_of([&] {
    w.write_file("a.safetensors", {{"w", torch::ones({4, 4}), {6, 4}, {3, 0}}});
  });
  EXPECT_HAS(msg, "cannot write tensor 'w' to " + (dir / "step_00000001.tmp/a.safetensors"));
  EXPECT_HAS(msg, "local shape [4, 4] at offsets [3, 0] does not fit inside global shape [6, 4]");
  msg = error_of([&] { w.write_file("a.safetensors", {{"w", torch::ones({4}), {4, 1}, {0, 0}}}); });
  EXPECT_HAS(msg, "local shape [4] at offsets [0, 0]");
  EXPECT_HAS(error_of([&] { w.write_file("../x.safetensors", {}); }), "plain file name");
  EXPECT_HAS(error_of([&] { w.write_file("manifest.json", {}); }), "plain file name");
  w.write_file("a.safetensors", {{"w", torch::ones({4})[0], {}, {}}});
  EXPECT_HAS(error_of([&] { w.write_file("a.safetensors", {}); }), "already wrote a file");
  w.finish_rank();
  EXPECT_HAS(error_of([&] { w.write_file("b.safetensors", {}); }), "already called finish_rank");
}

TEST(Checkpoint, TwoRanksWritingOneFileNameIsAnInternalError) {
  TempDir dir;
  CheckpointWriter::prepare(dir.path(), 1);
  for (int r = 0; r < 2; ++r) {
    CheckpointWriter w(dir.path(), 1, r);
    w.write_file("model.safetensors", {{"w" + std::to_string(r), torch::ones({2}), {2}, {0}}});
    w.finish_rank();
  }
  const auto msg = error_of([&] { CheckpointWriter::commit(dir.path(), 1, {}, {}, ""); });
  EXPECT_HAS(msg, "file model.safetensors was written by rank 0 and by rank 1");
}

TEST(Checkpoint, RecommittingAStepReplacesIt) {
  TempDir dir;
  save_whole(dir.path(), 4, {{"w", torch::zeros({3})}}, {{"v", 1}});
  save_whole(dir.path(), 4, {{"w", torch::ones({3})}, {"extra", torch::ones({1})}}, {{"v", 2}});
  CheckpointReader r(CheckpointReader::latest(dir.path()));
  EXPECT_TRUE(bitwise_equal(r.read_full("w"), torch::ones({3})));
  EXPECT_EQ(r.state()["v"], 2);
  EXPECT_TRUE(r.has("extra"));
  EXPECT_FALSE(fs::exists(dir / "step_00000004.tmp"));
  EXPECT_FALSE(fs::exists(dir / "step_00000004.old"));
}

TEST(Checkpoint, KeepDeletesAllButTheNewestSteps) {
  TempDir dir;
  for (std::int64_t step = 1; step <= 5; ++step) {
    save_whole(dir.path(), step * 10, {{"w", torch::full({2}, static_cast<double>(step))}},
               {{"step", step * 10}}, 2);
  }
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    left.push_back(e.path().filename().string());
  }
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"latest", "step_00000040", "step_00000050"}));
  CheckpointReader r(CheckpointReader::latest(dir.path()));
  EXPECT_EQ(r.step(), 50);
  EXPECT_TRUE(bitwise_equal(r.read_full("w"), torch::full({2}, 5.0)));
  // keep = 0 keeps everything.
  save_whole(dir.path(), 60, {{"w", torch::ones({2})}}, {}, 0);
  EXPECT_TRUE(fs::exists(dir / "step_00000040"));
}

// Pipeline stages write from ranks 0 and 2 (the dp 0, tp 0 rank of each):
// commit checks exactly those parts, so a missing highest-rank part or a
// part from a rank that should not write is refused.
TEST(Checkpoint, CommitChecksTheNamedWriters) {
  TempDir dir;
  const auto a = sample({4, 2}, at::kFloat), b = sample({3}, at::kFloat);
  CheckpointWriter::prepare(dir.path(), 1);
  CheckpointWriter w0(dir.path(), 1, 0);
  w0.write_file(rank_file(0), {{"embed.w", a, {4, 2}, {0, 0}}});
  w0.finish_rank();
  EXPECT_HAS(error_of([&] {
               CheckpointWriter::commit(dir.path(), 1, {}, {}, "", 0, {0, 2});
             }),
             "shards-rank00002.json is missing");
  CheckpointWriter w1(dir.path(), 1, 1);
  w1.finish_rank();
  CheckpointWriter w2(dir.path(), 1, 2);
  w2.write_file(rank_file(2), {{"head.b", b, {3}, {0}}});
  w2.finish_rank();
  EXPECT_HAS(error_of([&] {
               CheckpointWriter::commit(dir.path(), 1, {}, {}, "", 0, {0, 2});
             }),
             "comes from rank 1, which is not one of the writers");
  fs::remove(fs::path(dir / "step_00000001.tmp") / "shards-rank00001.json");
  CheckpointWriter::commit(dir.path(), 1, {}, {}, "", 0, {0, 2});
  CheckpointReader r(dir / "step_00000001");
  EXPECT_TRUE(r.has("embed.w"));
  EXPECT_TRUE(r.has("head.b"));
}

}  // namespace hp::ckpt::test
