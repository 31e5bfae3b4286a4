// A save killed by SIGKILL at each stage of writing (HP_FAULT_INJECT's
// checkpoint.* kill points) leaves the previous checkpoint and `latest`
// intact, and the next save succeeds. And the fault module itself: named
// points only, each with its action.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <csignal>
#include <nlohmann/json.hpp>

#include "hp/fault/fault.h"
#include "checkpoint/checkpoint.h"
#include "tests/ut/checkpoint/test_util.h"

namespace hp::ckpt::test {
namespace {

using nlohmann::json;

/// Saves step 2 as two ranks would (one process plays both), rank 1's tensor
/// in two pieces along dim 1.
void save_step_two(const std::string& root, const at::Tensor& w, const at::Tensor& b) {
  CheckpointWriter::prepare(root, 2);
  CheckpointWriter r0(root, 2, 0);
  r0.write_file(rank_file(0), {{"w", w.narrow(1, 0, 3), {4, 5}, {0, 0}}, {"b", b, {5}, {0}}});
  r0.finish_rank();
  CheckpointWriter r1(root, 2, 1);
  r1.write_file(rank_file(1), {{"w", w.narrow(1, 3, 2), {4, 5}, {0, 3}}});
  r1.finish_rank();
  CheckpointWriter::commit(root, 2, {{"step", 2}}, {{"tp", 2}}, "h2");
}

class KilledWhileSaving : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(KilledWhileSaving, PreviousCheckpointSurvives) {
  const std::string stage = GetParam();
  TempDir dir;
  const auto w1 = sample({4, 5}, at::kFloat, 1);
  save_whole(dir.path(), 1, {{"w", w1}}, {{"step", 1}});

  const auto w2 = sample({4, 5}, at::kFloat, 2);
  const auto b2 = sample({5}, at::kFloat, 3);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Another point armed too: only this one is reached first.
    ::setenv("HP_FAULT_INJECT", ("checkpoint." + stage + ",checkpoint.async_write").c_str(), 1);
    try {
      save_step_two(dir.path(), w2, b2);
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status))
      << "the child was not killed; exit status " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  EXPECT_EQ(WTERMSIG(status), SIGKILL);

  // The child died where it was told to.
  const std::string staging = dir / "step_00000002.tmp";
  if (stage == "after_files") {
    EXPECT_TRUE(fs::exists(staging + "/" + rank_file(0)));
    EXPECT_FALSE(fs::exists(staging + "/shards-rank00000.json"));
  } else if (stage == "before_rename") {
    EXPECT_TRUE(fs::exists(staging + "/manifest.json"));
    EXPECT_FALSE(fs::exists(dir / "step_00000002"));
  } else {
    EXPECT_FALSE(fs::exists(staging));
    EXPECT_TRUE(fs::exists(dir / "step_00000002/manifest.json"));
  }

  ASSERT_EQ(CheckpointReader::latest(dir.path()), dir / "step_00000001");
  {
    CheckpointReader r(CheckpointReader::latest(dir.path()));
    EXPECT_EQ(r.step(), 1);
    EXPECT_EQ(r.state()["step"], 1);
    EXPECT_TRUE(bitwise_equal(r.read_full("w"), w1));
  }

  // The next attempt cleans up after the dead one and commits.
  save_step_two(dir.path(), w2, b2);
  EXPECT_FALSE(fs::exists(staging));
  ASSERT_EQ(CheckpointReader::latest(dir.path()), dir / "step_00000002");
  CheckpointReader r(CheckpointReader::latest(dir.path()));
  EXPECT_EQ(r.state()["step"], 2);
  EXPECT_EQ(r.layout(), (Layout{{"tp", 2}}));
  EXPECT_TRUE(bitwise_equal(r.read_full("w"), w2));
  EXPECT_TRUE(bitwise_equal(r.read_full("b"), b2));
  EXPECT_TRUE(bitwise_equal(CheckpointReader(dir / "step_00000001").read_full("w"), w1));
}

INSTANTIATE_TEST_SUITE_P(Stages, KilledWhileSaving,
                         ::testing::Values("after_files", "before_rename", "before_latest"),
                         [](const auto& info) { return info.param; });

TEST(FaultInjection, UnknownPointsAreRefusedWithTheLegalList) {
  ::setenv("HP_FAULT_INJECT", "checkpoint:after_files, checkpoint.before_latest,nope", 1);
  EXPECT_EQ(fault::unknown_points(), "checkpoint:after_files, nope");
  try {
    fault::check_environment();
    ADD_FAILURE() << "an unknown point was accepted";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(
        msg.find("unknown fault point checkpoint:after_files, nope (legal: checkpoint.after_files, "
                 "checkpoint.before_rename, checkpoint.before_latest, checkpoint.async_write"),
        std::string::npos)
        << msg;
  }
  // An unknown name arms nothing: the save goes through.
  ::setenv("HP_FAULT_INJECT", "checkpoint:after_files,nope", 1);
  TempDir dir;
  save_whole(dir.path(), 1, {{"w", torch::ones({2})}}, {});
  EXPECT_EQ(CheckpointReader::latest(dir.path()), dir / "step_00000001");
  ::setenv("HP_FAULT_INJECT", " checkpoint.before_latest ", 1);
  EXPECT_NO_THROW(fault::check_environment());
  EXPECT_TRUE(fault::armed("checkpoint.before_latest"));
  EXPECT_FALSE(fault::armed("checkpoint.after_files"));
  ::unsetenv("HP_FAULT_INJECT");
  EXPECT_FALSE(fault::armed("checkpoint.before_latest"));
  EXPECT_NO_THROW(fault::check_environment());
}

TEST(FaultInjection, ThrowPointsThrowWhatFailedAndEveryPointIsInTheTable) {
  ::setenv("HP_FAULT_INJECT", "checkpoint.async_write", 1);
  try {
    fault::hit("checkpoint.async_write", "cannot write f (tensor 't')");
    ADD_FAILURE() << "an armed throw point did not throw";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(
        e.what(),
        "cannot write f (tensor 't'): injected failure (HP_FAULT_INJECT=checkpoint.async_write)");
  }
  ::unsetenv("HP_FAULT_INJECT");
  EXPECT_NO_THROW(fault::hit("checkpoint.async_write", "x"));
  // A hit() without its table line is a programming error, caught at once.
  EXPECT_THROW(fault::hit("checkpoint.not_in_the_table"), std::logic_error);
  for (const auto& p : fault::points()) {
    EXPECT_NE(std::string(p.where), "") << p.name;
    EXPECT_TRUE(std::string(fault::action_name(p.action)) == "kill" ||
                std::string(fault::action_name(p.action)) == "throw");
  }
}

}  // namespace hp::ckpt::test
