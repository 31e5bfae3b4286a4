// Every plugin-loading error, triggered with a real (deliberately broken)
// library, and the message it must show.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "hp/comm/context.h"
#include "hp/config/config.h"
#include "hp/optim/grad_sync.h"
#include "hp/optim/optimizer.h"
#include "hp/plugin/api_hash.h"
#include "hp/plugin/feature_runtime.h"
#include "framework/plugin/loader.h"
#include "framework/util/build_info.h"
#include "hp/trainer/checkpoint_adapter.h"
#include "hp/trainer/executor.h"
#include "framework/runtime/setup.h"
#include "tests/support/beside_executable.h"

namespace {

const std::string kDir = hp::test::beside_executable(HP_TEST_PLUGIN_DIR_REL);

std::string load_error(const std::string& name) {
  hp::PluginLoader loader({kDir});
  try {
    loader.load(name);
  } catch (const hp::PluginError& e) {
    return e.what();
  }
  return "";
}

std::string config_errors(const std::string& features_yaml) {
  std::string yaml = "data: {type: synthetic}\nplugins: {path: [" + kDir + "]}\nfeatures:\n" +
                     features_yaml;
  try {
    hp::prepare(hp::RawConfig::parse_string(yaml, "t.yaml"), 1);
  } catch (const hp::ConfigException& e) {
    return e.what();
  }
  return "";
}

bool mapped(const std::string& path) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(path) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

TEST(PluginLoader, NoSuchFeatureSuggestsAndSaysWhereItLooked) {
  auto err = load_error("test_godo");
  EXPECT_NE(err.find("no such feature 'test_godo': no libhp_feature_test_godo.so in [" + kDir + "]"),
            std::string::npos) << err;
  EXPECT_NE(err.find("did you mean 'test_good'?"), std::string::npos) << err;
  EXPECT_NE(err.find("features found: test_collab, test_conflicts, test_dims, test_faults, test_good"), std::string::npos) << err;
}

TEST(PluginLoader, LibraryThatFailsToLoadShowsTheLoaderError) {
  auto err = load_error("test_unloadable");
  EXPECT_NE(err.find("feature 'test_unloadable': cannot load " + kDir +
                     "/libhp_feature_test_unloadable.so: "),
            std::string::npos) << err;
  EXPECT_NE(err.find("undefined symbol: hp_test_symbol_that_does_not_exist"), std::string::npos)
      << err;
}

TEST(PluginLoader, FileThatIsNotALibrary) {
  const std::string dir = ::testing::TempDir() + "/hp_fake_plugins";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/libhp_feature_text.so") << "this is not an ELF file\n";
  hp::PluginLoader loader({dir});
  try {
    loader.load("text");
    FAIL();
  } catch (const hp::PluginError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot load " + dir + "/libhp_feature_text.so"),
              std::string::npos) << e.what();
  }
}

TEST(PluginLoader, MissingEntryPoint) {
  auto err = load_error("test_no_entry");
  EXPECT_NE(err.find("libhp_feature_test_no_entry.so is not a hyperparallel feature plugin: entry "
                     "point 'hp_feature_api_version' is missing"),
            std::string::npos) << err;
}

TEST(PluginLoader, ApiVersionMismatchNamesBothVersions) {
  auto err = load_error("test_old_api");
  EXPECT_NE(err.find("was built for plugin API version 0, but this hyperparallel"), std::string::npos)
      << err;
  EXPECT_NE(err.find("needs version " + std::to_string(hp::kFeatureApiVersion)), std::string::npos)
      << err;
}

// A plugin built against other plugin-visible headers is refused even at
// the same API version: the header hash names both sides.
TEST(PluginLoader, ApiHashMismatchNamesBothHashes) {
  auto err = load_error("test_stale_hash");
  EXPECT_EQ(err, "feature 'test_stale_hash': " + kDir +
                     "/libhp_feature_test_stale_hash.so was built against plugin headers with API hash "
                     "0000000000000000, but this hyperparallel " + hp::build_info::version() + " has API hash " +
                     HP_FEATURE_API_HASH + " (both at version " + std::to_string(hp::kFeatureApiVersion) +
                     "); rebuild the plugin against this hyperparallel");
}

TEST(PluginLoader, ConstructorThatThrows) {
  auto err = load_error("test_throws");
  EXPECT_NE(err.find("feature 'test_throws': the plugin's constructor failed in " + kDir +
                     "/libhp_feature_test_throws.so: cannot start: no widgets configured"),
            std::string::npos) << err;
}

TEST(PluginLoader, ObjectsKeepTheirLibraryLoaded) {
  std::shared_ptr<hp::Feature> feature;
  const std::string path = kDir + "/libhp_feature_test_good.so";
  {
    hp::PluginLoader loader({kDir});
    feature = loader.load("test_good").feature;
  }
  EXPECT_TRUE(mapped(path));
  // Calling into the plugin after the loader is gone must work.
  EXPECT_TRUE(feature->required_features().empty());
  hp::Schema schema;
  feature->declare_options(schema, "features.test_good.");
  EXPECT_NE(schema.find("features.test_good.size"), nullptr);
}

TEST(PluginConfig, FeatureOptionsAreValidatedAndRulesApplied) {
  EXPECT_EQ(config_errors("  test_good: {enabled: true, size: 4}\n"), "");
  auto err = config_errors("  test_good: {enabled: true, size: 3, sise: 1}\n");
  EXPECT_NE(err.find("features.test_good.size = 3: must be even"), std::string::npos) << err;
  EXPECT_NE(err.find("features.test_good.sise = 1: unknown key (did you mean "
                     "'features.test_good.size'?)"),
            std::string::npos) << err;
}

TEST(PluginConfig, FeatureThatNeedsAnotherThatIsOff) {
  auto err = config_errors("  test_needs: {enabled: true}\n");
  EXPECT_EQ(err,
            "config error: features.test_needs.enabled = true: feature 'test_needs' needs feature "
            "'test_good', which is not enabled (legal: set features.test_good.enabled: true, or "
            "disable test_needs)");
  EXPECT_EQ(config_errors("  test_needs: {enabled: true}\n  test_good: {enabled: true}\n"), "");
}

TEST(PluginConfig, ConflictingFeatures) {
  auto err = config_errors("  test_good: {enabled: true}\n  test_conflicts: {enabled: true}\n");
  EXPECT_NE(err.find("features 'test_good' and 'test_conflicts' cannot be enabled together"),
            std::string::npos) << err;
  EXPECT_EQ(config_errors("  test_good: {enabled: true}\n  test_conflicts: {enabled: false}\n"), "");
}

TEST(PluginConfig, LoadErrorsAreConfigErrorsAndSuppressTheirOptions) {
  auto err = config_errors("  test_throws: {enabled: true, whatever: 1}\n");
  EXPECT_NE(err.find("config error: features.test_throws = enabled: true: feature 'test_throws': "
                     "the plugin's constructor failed"),
            std::string::npos) << err;
  EXPECT_EQ(err.find("whatever"), std::string::npos) << err;
}

TEST(FeatureRuntime, InstallRegistersHooksThatRun) {
  auto setup = hp::prepare(
      hp::RawConfig::parse_string("data: {type: synthetic}\nplugins: {path: [" + kDir +
                                      "]}\nfeatures: {test_good: {enabled: true}}\n",
                                  "t.yaml"),
      1);
  ASSERT_EQ(setup.features.size(), 1u);
  hp::FeatureRuntime rt(setup.config, *hp::dist::DistributedContext::single());
  rt.install(setup.features);
  EXPECT_TRUE(rt.has_feature("test_good"));
  EXPECT_EQ(rt.hook_count(hp::StepEvent::kStepEnd), 1u);
  hp::StepContext sc;
  sc.step = 5;
  rt.run_hooks(hp::StepEvent::kStepEnd, sc);
}

// One feature at most replaces the step executor; a second is refused naming both.
TEST(FeatureRuntime, SecondExecutorIsRefusedNamingBoth) {
  auto setup = hp::prepare(hp::RawConfig::parse_string("data: {type: synthetic}\n", "t.yaml"), 1);
  hp::FeatureRuntime rt(setup.config, *hp::dist::DistributedContext::single());
  EXPECT_EQ(rt.executor(), nullptr);
  rt.set_executor("pipeline_parallel", hp::make_sequential_executor());
  ASSERT_NE(rt.executor(), nullptr);
  try {
    rt.set_executor("other_feature", hp::make_sequential_executor());
    FAIL() << "a second executor was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "the step executor is replaced by both 'pipeline_parallel' and 'other_feature'");
  }
}

// Every replaceable collaborator has one owner; a second is refused naming both.
TEST(FeatureRuntime, SecondOwnerOfEachCollaboratorIsRefusedNamingBoth) {
  auto setup = hp::prepare(hp::RawConfig::parse_string("data: {type: synthetic}\n", "t.yaml"), 1);
  hp::FeatureRuntime rt(setup.config, *hp::dist::DistributedContext::single());
  auto expect_refused = [](const std::function<void()>& second, const std::string& what) {
    try {
      second();
      FAIL() << "a second " << what << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()), "the " + what + " is replaced by both 'zero' and 'other'");
    }
  };
  hp::OptimizerFactory opt = [](const hp::OptimizerOptions&, const std::vector<hp::ParamEntry>&,
                                hp::dist::DistributedContext&) { return std::unique_ptr<hp::Optimizer>(); };
  hp::GradReducerFactory red = [](const hp::ReducerOptions&, const std::vector<hp::ParamEntry>&,
                                  hp::dist::DistributedContext&) { return std::unique_ptr<hp::GradReducer>(); };
  hp::CheckpointIOFactory io = [](const hp::CheckpointOptions&, const hp::Config&, hp::dist::DistributedContext&) {
    return std::unique_ptr<hp::CheckpointIO>();
  };
  EXPECT_EQ(rt.owner_of("optimizer"), "");
  rt.set_optimizer("zero", opt);
  rt.set_grad_reducer("zero", red);
  rt.set_checkpoint_io("zero", io);
  EXPECT_EQ(rt.owner_of("checkpoint IO"), "zero");
  expect_refused([&] { rt.set_optimizer("other", opt); }, "optimizer");
  expect_refused([&] { rt.set_grad_reducer("other", red); }, "gradient reducer");
  expect_refused([&] { rt.set_checkpoint_io("other", io); }, "checkpoint IO");
  try {
    rt.owner_of("scheduler");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "unknown collaborator 'scheduler' (legal: executor, optimizer, gradient reducer, checkpoint IO)");
  }
  hp::FeatureRuntime fresh(setup.config, *hp::dist::DistributedContext::single());
  try {
    fresh.set_optimizer("zero", nullptr);
    FAIL() << "an empty optimizer factory was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "feature 'zero' installs an empty optimizer");
  }
  EXPECT_FALSE(fresh.has_metrics());
  try {
    fresh.metrics();
    FAIL();
  } catch (const std::logic_error& e) {
    EXPECT_STREQ(e.what(), "this host has no metrics registry (a tool that runs no training)");
  }
}
