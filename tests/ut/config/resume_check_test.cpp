// A resume against the config its checkpoint stores: changed model keys are
// refused before start (free ones and partial loads excepted), changed
// training keys are named in one line, a checkpoint without a stored config
// is said to be not comparable.
#include "framework/trainer/resume_check.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "hp/checkpoint/writer.h"
#include "hp/config/config.h"
#include "framework/model/registry.h"
#include "framework/runtime/setup.h"

namespace {

namespace fs = std::filesystem;

const char* kBase = R"(
model: {type: gpt, layers: 4, hidden: 64, heads: 4, seq_len: 32, vocab_size: 64}
data: {type: synthetic}
training: {max_steps: 20, global_batch_size: 8, micro_batch_size: 2}
optimizer: {lr: 0.002}
)";

hp::Config resolved(const std::vector<std::string>& overrides) {
  auto raw = hp::RawConfig::parse_string(kBase, "test.yaml");
  for (const auto& o : overrides) raw.apply_override(o);
  return hp::prepare(raw, 1).config;
}

/// A committed step with no tensors whose stored config is `config_text`.
struct StoredCheckpoint {
  std::string root;
  StoredCheckpoint(const std::string& config_text) {
    root = (fs::temp_directory_path() / ("hp_resume_check_" + std::to_string(::getpid()))).string();
    fs::remove_all(root);
    hp::ckpt::CheckpointWriter::prepare(root, 10);
    hp::ckpt::CheckpointWriter w(root, 10, 0);
    w.finish_rank();
    hp::ckpt::CheckpointWriter::commit(root, 10, {{"step", 10}}, {{"dp", 1}}, config_text);
  }
  ~StoredCheckpoint() { fs::remove_all(root); }
  std::string step_dir() const { return root + "/step_00000010"; }
};

/// prepare()'s refusal, "" when it accepts.
std::string refusal(const std::vector<std::string>& overrides) {
  try {
    auto raw = hp::RawConfig::parse_string(kBase, "test.yaml");
    for (const auto& o : overrides) raw.apply_override(o);
    hp::prepare(raw, 1);
  } catch (const hp::ConfigException& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ResumeCheck, DiffSortsKeysByWhatMayChange) {
  const std::string stored = resolved({}).to_yaml();
  const auto now = resolved({"model.layers=2", "model.dropout=0.1", "optimizer.lr=0.001",
                             "training.max_steps=40", "run.seed=9", "checkpoint.interval=5"});
  const auto diff = hp::diff_configs(stored, now, hp::model_info(now).free_keys);
  EXPECT_EQ(hp::describe_changes(diff.model), "model.layers 4 -> 2");
  EXPECT_EQ(hp::describe_changes(diff.model_free), "model.dropout 0.0 -> 0.1");
  EXPECT_EQ(hp::describe_changes(diff.training),
            "optimizer.lr 0.002 -> 0.001, training.max_steps 20 -> 40");
  // Nothing changed: nothing to say.
  const auto same = hp::diff_configs(stored, resolved({}), {});
  EXPECT_TRUE(same.model.empty() && same.model_free.empty() && same.training.empty());
  // A key the checkpoint's config lacks (an option added since) is not refused.
  const auto older = hp::diff_configs("model: {type: gpt}\n", resolved({}), {});
  EXPECT_TRUE(older.model.empty());
  EXPECT_NE(hp::describe_changes(older.model_free).find("model.layers (not recorded) -> 4"),
            std::string::npos);
}

TEST(ResumeCheck, GptDeclaresItsImplementationChoicesFree) {
  const auto free = hp::model_info(resolved({})).free_keys;
  EXPECT_TRUE(free.count("model.dropout"));
  EXPECT_TRUE(free.count("model.init_std"));
  EXPECT_FALSE(free.count("model.layers"));
  EXPECT_FALSE(free.count("model.hidden"));
}

TEST(ResumeCheck, ChangedModelKeysAreRefusedBeforeStart) {
  StoredCheckpoint ck(resolved({}).to_yaml());
  const std::string resume = "checkpoint.resume=" + ck.step_dir();
  const auto msg = refusal({resume, "model.layers=2", "model.hidden=32", "model.heads=2"});
  EXPECT_NE(msg.find("config error: checkpoint.resume = " + ck.step_dir() +
                     ": the checkpoint was written with other model options (checkpoint -> this "
                     "run): model.heads 4 "
                     "-> 2, model.hidden 64 -> 32, model.layers 4 -> 2"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("checkpoint.strict: false"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  // The root resolves through `latest` as checkpoint.resume: auto does.
  EXPECT_NE(refusal({"checkpoint.dir=" + ck.root, "model.layers=2"}).find("model.layers 4 -> 2"),
            std::string::npos);
  // Free keys, training keys, a partial load, or no resume at all: accepted.
  EXPECT_EQ(refusal({resume, "model.dropout=0.2", "training.max_steps=30", "optimizer.lr=0.01"}),
            "");
  EXPECT_EQ(refusal({resume, "model.layers=2", "checkpoint.strict=false"}), "");
  EXPECT_EQ(refusal({"checkpoint.resume=never", "checkpoint.dir=" + ck.root, "model.layers=2"}),
            "");
}

TEST(ResumeCheck, NotesNameTheChangesInOneLineEach) {
  StoredCheckpoint ck(resolved({}).to_yaml());
  const auto now = resolved({"model.dropout=0.1", "optimizer.lr=0.001", "training.max_steps=40"});
  const auto notes = hp::resume_config_notes(resolved({}).to_yaml(), now, ck.step_dir());
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_EQ(notes[0],
            "resuming with changed training options: optimizer.lr 0.002 -> 0.001, "
            "training.max_steps 20 -> 40");
  EXPECT_EQ(notes[1],
            "resuming with changed model options the model declares free to change: model.dropout "
            "0.0 -> 0.1");
  const auto partial = hp::resume_config_notes(
      resolved({}).to_yaml(), resolved({"model.layers=2", "checkpoint.strict=false"}), "d");
  ASSERT_EQ(partial.size(), 1u);
  EXPECT_EQ(
      partial[0],
      "partial load (checkpoint.strict: false) with changed model options: model.layers 4 -> 2");
  const auto old = hp::resume_config_notes("", now, "d");
  ASSERT_EQ(old.size(), 1u);
  EXPECT_NE(old[0].find("checkpoint d stores no config"), std::string::npos);
  EXPECT_NE(old[0].find("the config could not be compared"), std::string::npos);
  EXPECT_TRUE(hp::resume_config_notes(resolved({}).to_yaml(), resolved({}), "d").empty());
}

TEST(ResumeCheck, ACheckpointWithoutStoredConfigIsNotRefused) {
  StoredCheckpoint ck("");
  EXPECT_EQ(refusal({"checkpoint.resume=" + ck.step_dir(), "model.layers=2"}), "");
}

namespace {

TEST(ResumeCheck, APrecisionChangeIsLoggedNotRefused) {
  // The precision comes from the checkpoint's run state (the dtype names the
  // trainer records), not from any feature's keys in its config.
  EXPECT_EQ(hp::describe_precision("fp32", "fp32"), "fp32");
  EXPECT_EQ(hp::describe_precision("bf16", "fp32"), "bf16 compute (gradient sums in fp32)");
  EXPECT_EQ(hp::describe_precision("bf16", "bf16"), "bf16 compute (gradient sums in bf16)");
  EXPECT_EQ(hp::describe_precision("", ""), "not recorded");
  const std::string same = resolved({}).to_yaml();
  const auto notes = hp::resume_config_notes(same, resolved({}), "d", hp::describe_precision("bf16", "fp32"),
                                             hp::describe_precision("fp32", "fp32"));
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0],
            "resuming in another precision: the checkpoint was written in bf16 compute (gradient sums in fp32), this "
            "run trains in fp32 (the checkpoint holds fp32 masters, loaded as they are)");
  // Same precision: nothing to say; a checkpoint that does not record its
  // precision is taken as fp32 (all such were) and named only when this run
  // trains in another.
  EXPECT_TRUE(hp::resume_config_notes(same, resolved({}), "d", "fp32", "fp32").empty());
  EXPECT_TRUE(hp::resume_config_notes(same, resolved({}), "d", "not recorded", "fp32").empty());
  const auto unrecorded =
      hp::resume_config_notes(same, resolved({}), "d", "not recorded", hp::describe_precision("bf16", "fp32"));
  ASSERT_EQ(unrecorded.size(), 1u);
  EXPECT_EQ(unrecorded[0].find("resuming in bf16 compute (gradient sums in fp32) from a checkpoint that does not record"), 0u);
  EXPECT_EQ(refusal({"features.mixed_precision.enabled=true"}), "");
  EXPECT_NE(refusal({"features.mixed_precision.enabled=true", "features.mixed_precision.param_dtype=fp16"})
                .find("features.mixed_precision.param_dtype"),
            std::string::npos);
}

}  // namespace
