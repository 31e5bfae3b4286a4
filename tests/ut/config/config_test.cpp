// Config parsing, overrides, defaults and every kind of refusal.
#include <gtest/gtest.h>

#include "hp/config/config.h"
#include "framework/runtime/setup.h"

namespace {

std::string errors_of(const std::string& yaml, int world = 1,
                      const std::vector<std::string>& overrides = {}) {
  try {
    auto raw = hp::RawConfig::parse_string(yaml, "test.yaml");
    for (const auto& o : overrides) raw.apply_override(o);
    hp::prepare(raw, world);
  } catch (const hp::ConfigException& e) {
    return e.what();
  }
  return "";
}

int lines(const std::string& s) {
  if (s.empty()) return 0;
  return 1 + static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

const char* kValid = R"(
run: {name: t, seed: 7}
model: {type: gpt, layers: 2, hidden: 64, heads: 4}
data: {type: synthetic}
training: {max_steps: 5, global_batch_size: 8, micro_batch_size: 2}
)";

}  // namespace

TEST(Config, ValidConfigResolvesWithDefaults) {
  auto raw = hp::RawConfig::parse_string(kValid, "test.yaml");
  auto setup = hp::prepare(raw, 2);
  const auto& c = setup.config;
  EXPECT_EQ(c.get_int("model.layers"), 2);
  EXPECT_EQ(c.get_int("run.seed"), 7);
  EXPECT_EQ(c.get_string("optimizer.type"), "adamw");  // default
  EXPECT_TRUE(c.is_set("model.hidden"));
  EXPECT_FALSE(c.is_set("optimizer.lr"));
  EXPECT_EQ(setup.mesh.group_size("dp"), 2);
  EXPECT_NE(c.to_yaml().find("micro_batch_size: 2"), std::string::npos);
}

TEST(Config, ResolvedYamlRoundTrips) {
  auto raw = hp::RawConfig::parse_string(kValid, "test.yaml");
  auto first = hp::prepare(raw, 1).config.to_yaml();
  auto again = hp::prepare(hp::RawConfig::parse_string(first, "resolved.yaml"), 1).config.to_yaml();
  EXPECT_EQ(first, again);
}

TEST(Config, OverrideReplacesAValueAndAcceptsLists) {
  auto raw = hp::RawConfig::parse_string(kValid, "test.yaml");
  raw.apply_override("training.max_steps=42");
  raw.apply_override("plugins.path=[/tmp/a, /tmp/b]");
  auto c = hp::prepare(raw, 1).config;
  EXPECT_EQ(c.get_int("training.max_steps"), 42);
  EXPECT_EQ(c.get_string_list("plugins.path"), (std::vector<std::string>{"/tmp/a", "/tmp/b"}));
}

TEST(Config, MalformedOverrideIsRefused) {
  auto raw = hp::RawConfig::parse_string(kValid, "test.yaml");
  try {
    raw.apply_override("training.max_steps");
    FAIL();
  } catch (const hp::ConfigException& e) {
    EXPECT_NE(std::string(e.what()).find("an override must look like key.path=value"),
              std::string::npos);
  }
}

TEST(Config, UnknownKeyGetsDidYouMean) {
  auto err = errors_of(std::string(kValid) + "optimizer: {lerning_rate: 0.1, lr: 0.1}\n");
  EXPECT_NE(err.find("config error: optimizer.lerning_rate = 0.1: unknown key"), std::string::npos)
      << err;
  auto err2 = errors_of(std::string(kValid) + "traning: {x: 1}\n");
  EXPECT_NE(err2.find("traning: unknown key (did you mean 'training'?)"), std::string::npos) << err2;
  EXPECT_EQ(lines(err2), 1) << "children of an unknown section are not reported again:\n" << err2;
}

TEST(Config, WrongTypeNamesPathValueAndLegalRange) {
  auto err = errors_of(kValid, 1, {"model.layers=four"});
  EXPECT_EQ(err,
            "config error: model.layers = four: expected an integer (legal: an integer in "
            "[1, 1024])");
}

TEST(Config, OutOfRangeAndBadEnum) {
  auto err = errors_of(kValid, 1, {"model.dropout=1.5", "optimizer.type=adamm"});
  EXPECT_NE(err.find("config error: model.dropout = 1.5: out of range (legal: a number in [0, 0.9])"),
            std::string::npos) << err;
  EXPECT_NE(err.find("optimizer.type = adamm: not a known choice (did you mean 'adam'?) "
                     "(legal: one of: sgd, adam, adamw)"),
            std::string::npos) << err;
}

TEST(Config, CrossFieldRules) {
  // heads must divide hidden; micro batch x dp must divide global batch.
  auto err = errors_of(kValid, 3, {"model.heads=5"});
  EXPECT_NE(err.find("model.heads = 5: must divide model.hidden = 64"), std::string::npos) << err;
  EXPECT_NE(err.find("training.global_batch_size = 8: must be divisible by micro_batch_size x "
                     "data-parallel size = 2 x 3 = 6 (legal: a multiple of 6)"),
            std::string::npos) << err;
}

TEST(Config, WorldSizeMustMatchTheMesh) {
  auto err = errors_of(kValid, 4, {"distributed.data_parallel_size=3"});
  EXPECT_NE(err.find("distributed.data_parallel_size = 3: world size 4 != dp = 3 [no dimension claimed] (legal: 4 or 0 (derive))"),
            std::string::npos) << err;
}

TEST(Config, MeshOrderMustNameEveryDimensionOnce) {
  auto err = errors_of(kValid, 4, {"distributed.mesh_order=dp-pp"});
  EXPECT_NE(err.find("config error: distributed.mesh_order = dp-pp: names 'pp', which is not a dimension of this run "
                     "(or is named twice) (legal: the dimensions dp, each once, joined by '-', innermost first)"),
            std::string::npos)
      << err;
}

TEST(Config, ThreeMistakesGiveThreeLines) {
  auto err = errors_of(kValid, 2, {"model.layerz=3", "optimizer.lr=fast", "model.heads=3"});
  EXPECT_EQ(lines(err), 3) << err;
}

TEST(Config, NcclIsRefusedOnACpuBuildWithTheReason) {
  auto err = errors_of(kValid, 1, {"distributed.backend=nccl"});
  EXPECT_NE(err.find("distributed.backend = nccl: this hyperparallel was built against a LibTorch "
                     "without CUDA"),
            std::string::npos) << err;
  EXPECT_NE(err.find("(legal: auto, gloo)"), std::string::npos);
}

TEST(Config, MissingCorpusIsRefused) {
  auto err = errors_of(kValid, 1, {"data.type=text", "data.path=/nonexistent/corpus"});
  EXPECT_NE(err.find("data.path = /nonexistent/corpus: does not exist"), std::string::npos) << err;
}

TEST(Config, BadYamlNamesFileAndLine) {
  auto err = errors_of("model: {layers: 2\ntraining: [\n");
  EXPECT_NE(err.find("config error: test.yaml:"), std::string::npos) << err;
  EXPECT_NE(err.find("not valid YAML"), std::string::npos) << err;
}

TEST(Config, SectionGivenAScalarIsRefused) {
  auto err = errors_of("training: 5\n");
  EXPECT_NE(err.find("training = 5: is a section and needs a mapping of options"), std::string::npos)
      << err;
}

TEST(Config, UnknownFeatureIsAConfigError) {
  auto err = errors_of(std::string(kValid) + "features: {no_such_feature: {enabled: true}}\n");
  EXPECT_NE(err.find("features.no_such_feature = enabled: true: no such feature 'no_such_feature'"),
            std::string::npos) << err;
}
