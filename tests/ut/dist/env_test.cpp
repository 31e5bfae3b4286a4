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

// ---- Slurm: where rank 0 listens (srun sets no MASTER_ADDR / MASTER_PORT) ----

namespace {
std::map<std::string, std::string> slurm_task(std::map<std::string, std::string> more) {
  std::map<std::string, std::string> v = {{"SLURM_PROCID", "1"},
                                          {"SLURM_NTASKS", "4"},
                                          {"SLURM_LOCALID", "1"},
                                          {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}};
  for (auto& [k, val] : more) v[k] = val;
  return v;
}
}  // namespace

TEST(DistEnvSlurm, RankZeroIsOnTheFirstHostOfTheStep) {
  auto e = hp::dist::read_dist_env(from(slurm_task({{"SLURM_STEP_NODELIST", "gpu[07-09,12],cpu1"},
                                                    {"SLURM_JOB_NODELIST", "other1"},
                                                    {"SLURM_LAUNCH_NODE_IPADDR", "10.1.1.1"}})));
  EXPECT_EQ(e.master_addr, "gpu07");
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_from, "address from first host of SLURM_STEP_NODELIST, port from the default");
}

TEST(DistEnvSlurm, HostListForms) {
  const std::pair<const char*, const char*> cases[] = {
      {"node1", "node1"},           {"n1,n2", "n1"},        {"n[3-4]", "n3"},
      {"r[1-2]n[005,9]", "r1n005"}, {"a[7]-ib,b", "a7-ib"}, {"x[10,2-3]y[1-2],z", "x10y1"}};
  for (const auto& [list, first] : cases) {
    auto e = hp::dist::read_dist_env(from(slurm_task({{"SLURM_JOB_NODELIST", list}})));
    EXPECT_EQ(e.master_addr, first) << list;
  }
}

TEST(DistEnvSlurm, PortFromTheJobIdUnlessMasterPortIsSet) {
  auto e = hp::dist::read_dist_env(
      from(slurm_task({{"SLURM_JOB_ID", "987654321"}, {"SLURM_NODELIST", "a[1-2]"}})));
  EXPECT_EQ(e.master_port, 15000 + 4321);
  EXPECT_EQ(e.master_from,
            "address from first host of SLURM_NODELIST, port from 15000 + SLURM_JOB_ID mod 10000");
  e = hp::dist::read_dist_env(from(slurm_task({{"SLURM_JOB_ID", "7"}})));
  EXPECT_EQ(e.master_port, 15007);
  e = hp::dist::read_dist_env(from(slurm_task({{"SLURM_JOB_ID", "7"},
                                               {"MASTER_PORT", "2222"},
                                               {"MASTER_ADDR", "h0"},
                                               {"SLURM_NODELIST", "a[1-2]"}})));
  EXPECT_EQ(e.master_port, 2222);
  EXPECT_EQ(e.master_addr, "h0");
  EXPECT_EQ(e.master_from, "address from MASTER_ADDR, port from MASTER_PORT");
}

TEST(DistEnvSlurm, LaunchNodeAddressWhenNoNodeList) {
  auto e = hp::dist::read_dist_env(from(slurm_task({{"SLURM_LAUNCH_NODE_IPADDR", "10.1.1.1"}})));
  EXPECT_EQ(e.master_addr, "10.1.1.1");
  EXPECT_EQ(e.master_port, 29500);
}

TEST(DistEnvSlurm, MalformedValuesAreRefusedWithTheVariableAndTheFix) {
  for (const char* bad : {"node[", "node[x-1]", "a]b", "n[]"}) {
    try {
      hp::dist::read_dist_env(from(slurm_task({{"SLURM_STEP_NODELIST", bad}})));
      FAIL() << bad;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("SLURM_STEP_NODELIST='") + bad +
                                           "' is not a Slurm host list"),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("set MASTER_ADDR"), std::string::npos);
    }
  }
  // MASTER_ADDR set: the list is not read at all.
  EXPECT_EQ(hp::dist::read_dist_env(
                from(slurm_task({{"SLURM_STEP_NODELIST", "node["}, {"MASTER_ADDR", "h"}})))
                .master_addr,
            "h");
  try {
    hp::dist::read_dist_env(from(slurm_task({{"SLURM_JOB_ID", "12_3"}})));
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(
        std::string(e.what()).find("SLURM_JOB_ID='12_3' is not a job number; set MASTER_PORT"),
        std::string::npos)
        << e.what();
  }
}
