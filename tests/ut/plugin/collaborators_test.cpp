// The collaborator slots through a real training run: a fixture plugin
// replaces the executor, optimizer, gradient reducer and checkpoint IO and
// registers a hook and a series; every one must be called. And a mesh
// claim that nothing serves is a config error.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "hp/config/config.h"
#include "framework/runtime/setup.h"
#include "framework/trainer/trainer.h"
#include "tests/support/beside_executable.h"

namespace {
const std::string kDir = hp::test::beside_executable(HP_TEST_PLUGIN_DIR_REL);
}

TEST(Collaborators, EveryReplacedCollaboratorIsCalled) {
  const std::string out = (std::filesystem::temp_directory_path() / "hp_collab_run").string();
  std::filesystem::remove_all(out);
  auto trainer = hp::Trainer::from_yaml("data: {type: synthetic}\nmodel: {layers: 1, hidden: 16, heads: 2, "
                                        "seq_len: 8, vocab_size: 32}\ntraining: {max_steps: 3, global_batch_size: 4, "
                                        "micro_batch_size: 2, log_interval: 1}\nplugins: {path: [" + kDir + "]}\n");
  trainer.set("run.output_dir", out).enable("test_collab");
  const auto result = trainer.fit();
  ASSERT_EQ(result.losses.size(), 3u);
  std::ifstream in(out + "/collab_calls.txt");
  std::string line;
  std::getline(in, line);
  // Two micro-batches per step through the executor's run, one reduction,
  // one clip and one update per step, one save at the end, and a hook whose
  // context had the parameters, optimizer, context, metrics and loss.
  EXPECT_EQ(line, "optimizer_steps=3 reduces=3 clips=3 saves=1 executor_runs=3 hooks=3 contexts_ok=3");
  std::ifstream jl(out + "/metrics.jsonl");
  std::stringstream all;
  all << jl.rdbuf();
  EXPECT_NE(all.str().find("\"test_collab_parameters\""), std::string::npos) << "a hook's figure reaches metrics.jsonl";
  std::filesystem::remove_all(out);
}

TEST(Collaborators, ADoubleMeshClaimIsAConfigError) {
  try {
    hp::prepare(hp::RawConfig::parse_string("data: {type: synthetic}\nplugins: {path: [" + kDir +
                                                "]}\nfeatures: {test_collab: {enabled: true, claim_unserved: true}}\n",
                                            "t.yaml"),
                2);
    FAIL() << "a second claim of 'tp' was accepted";
  } catch (const hp::ConfigException& e) {
    EXPECT_NE(std::string(e.what()).find("config error: features: mesh dimension 'tp' is claimed by both 'test_collab' "
                                         "and 'test_collab_again'"),
              std::string::npos)
        << e.what();
  }
}

// A plugin's own dimension, view and flat group: the mesh serves them with
// no change outside the plugin (the dimension's role puts it between split
// and replicate dimensions; its gradients are summed with dp's).
TEST(Collaborators, APluginsOwnDimensionViewAndFlatGroupAreServed) {
  const auto setup = hp::prepare(
      hp::RawConfig::parse_string("data: {type: synthetic}\nplugins: {path: [" + kDir +
                                      "]}\nfeatures: {test_collab: {enabled: true, claim_dimension: true}}\n",
                                  "t.yaml"),
      8);
  const auto& m = setup.mesh;
  EXPECT_EQ(m.order(), "xp-dp");
  EXPECT_EQ(m.group_size("dp"), 4);
  EXPECT_EQ(m.group_ranks("xp", 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(m.group_size("xa"), 4);
  EXPECT_EQ(m.group_ranks("xa", 5), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(m.group_ranks("xb", 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(m.group_size("xflat"), 8);
  EXPECT_EQ(m.data_dims(), (std::vector<std::string>{"xp", "dp"}));
  EXPECT_EQ(m.replicas(), 4);
}
