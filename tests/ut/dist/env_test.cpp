#include <gtest/gtest.h>

#include <map>

#include "backends/dist/env.h"

namespace {
hp::dist::GetEnv from(std::map<std::string, std::string> vars) {
  auto shared = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [shared](const char* n) -> const char* {
    auto it = shared->find(n);
    return it == shared->end() ? nullptr : it->second.c_str();
  };
}
}  // namespace

TEST(DistEnv, NothingSetIsOneProcess) {
  auto e = hp::dist::read_dist_env(from({}));
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.source, "single");
}

TEST(DistEnv, TorchrunNames) {
  auto e = hp::dist::read_dist_env(from({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"},
                                         {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.1"},
                                         {"MASTER_PORT", "1234"}}));
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "10.0.0.1");
  EXPECT_EQ(e.master_port, 1234);
  EXPECT_EQ(e.source, "torchrun");
}

TEST(DistEnv, OpenMpiNames) {
  auto e = hp::dist::read_dist_env(from({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "8"},
                                         {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                         {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}));
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.source, "openmpi");
}

TEST(DistEnv, SlurmNames) {
  auto e = hp::dist::read_dist_env(from({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"},
                                         {"SLURM_LOCALID", "0"}, {"SLURM_NTASKS_PER_NODE", "2(x2)"},
                                         {"SLURM_LAUNCH_NODE_IPADDR", "10.1.1.1"}}));
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "10.1.1.1");
  EXPECT_EQ(e.source, "slurm");
}

TEST(DistEnv, InconsistentEnvironmentIsRefusedWithTheVariable) {
  try {
    hp::dist::read_dist_env(from({{"RANK", "1"}}));
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("WORLD_SIZE is not set, but RANK is"), std::string::npos);
  }
  try {
    hp::dist::read_dist_env(from({{"RANK", "4"}, {"WORLD_SIZE", "4"}}));
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 4 is not below the world size 4"), std::string::npos);
  }
  try {
    hp::dist::read_dist_env(from({{"RANK", "x"}, {"WORLD_SIZE", "4"}}));
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("RANK='x' is not a non-negative integer"), std::string::npos);
  }
}
