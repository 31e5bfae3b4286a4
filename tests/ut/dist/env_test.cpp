#include "hp/comm/env.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

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
  EXPECT_EQ(e.source, "env");  // no launcher's mark: a plain environment
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

// The environment each launcher leaves its workers, as they set it (names and
// value forms read from the launchers themselves).

namespace {
std::string error_of(std::map<std::string, std::string> vars) {
  try {
    hp::dist::read_dist_env(from(std::move(vars)));
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << "not one line: " << what;
    return what;
  }
  ADD_FAILURE() << "accepted";
  return "";
}
}  // namespace

TEST(DistEnv, HpLaunchWorker) {
  auto e = hp::dist::read_dist_env(from({{"RANK", "1"},
                                         {"WORLD_SIZE", "2"},
                                         {"LOCAL_RANK", "1"},
                                         {"LOCAL_WORLD_SIZE", "2"},
                                         {"GROUP_RANK", "0"},
                                         {"GROUP_WORLD_SIZE", "1"},
                                         {"MASTER_ADDR", "127.0.0.1"},
                                         {"MASTER_PORT", "41234"},
                                         {"HP_LAUNCHED", "1"},
                                         {"OMP_NUM_THREADS", "1"},
                                         {"HP_INTRA_OP_THREADS", "1"}}));
  EXPECT_EQ(e.source, "hp-launch");
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.master_port, 41234);
  EXPECT_FALSE(e.agent_store);
  auto t = hp::dist::choose_intra_op_threads(e, 2);
  EXPECT_EQ(t.threads, 1);
  EXPECT_EQ(t.why, "HP_INTRA_OP_THREADS=1, hp-launch's share");
}

TEST(DistEnv, TorchrunStaticRendezvousUsesTheAgentStoreUnderTheAttemptPrefix) {
  // torchrun --nnodes 2 --node_rank 1 --nproc_per_node 2, third attempt.
  auto e = hp::dist::read_dist_env(from({{"LOCAL_RANK", "1"},
                                         {"RANK", "3"},
                                         {"GROUP_RANK", "1"},
                                         {"ROLE_RANK", "3"},
                                         {"ROLE_NAME", "default"},
                                         {"LOCAL_WORLD_SIZE", "2"},
                                         {"WORLD_SIZE", "4"},
                                         {"GROUP_WORLD_SIZE", "2"},
                                         {"ROLE_WORLD_SIZE", "4"},
                                         {"MASTER_ADDR", "10.0.0.1"},
                                         {"MASTER_PORT", "29517"},
                                         {"TORCHELASTIC_RESTART_COUNT", "2"},
                                         {"TORCHELASTIC_MAX_RESTARTS", "3"},
                                         {"TORCHELASTIC_RUN_ID", "none"},
                                         {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                         {"NCCL_ASYNC_ERROR_HANDLING", "1"},
                                         {"OMP_NUM_THREADS", "1"}}));
  EXPECT_EQ(e.source, "torchrun");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "10.0.0.1");
  EXPECT_EQ(e.master_port, 29517);
  EXPECT_TRUE(e.agent_store);
  EXPECT_EQ(e.restart_count, 2);
  EXPECT_EQ(e.store_prefix, "/worker/attempt_2");
  auto t = hp::dist::choose_intra_op_threads(e, 8);
  EXPECT_EQ(t.threads, 1);
  EXPECT_EQ(t.why, "OMP_NUM_THREADS=1");
  EXPECT_EQ(hp::dist::describe_launch(e),
            "torchrun: rank 3 of 4, local 1 of 2, store: torchrun's agent at 10.0.0.1:29517 "
            "(client), keys under "
            "/worker/attempt_2");
}

TEST(DistEnv, TorchrunC10dRendezvousLetsRankZeroServe) {
  // torchrun --standalone --nproc_per_node 1: the agent picked host and port
  // for rank 0's store and left OMP_NUM_THREADS alone (one worker).
  auto e = hp::dist::read_dist_env(from({{"LOCAL_RANK", "0"},
                                         {"RANK", "0"},
                                         {"GROUP_RANK", "0"},
                                         {"LOCAL_WORLD_SIZE", "1"},
                                         {"WORLD_SIZE", "1"},
                                         {"MASTER_ADDR", "node-a.example"},
                                         {"MASTER_PORT", "45113"},
                                         {"TORCHELASTIC_RESTART_COUNT", "1"},
                                         {"TORCHELASTIC_MAX_RESTARTS", "3"},
                                         {"TORCHELASTIC_RUN_ID", "3f1c2d"},
                                         {"TORCHELASTIC_USE_AGENT_STORE", "False"}}));
  EXPECT_EQ(e.source, "torchrun");
  EXPECT_FALSE(e.agent_store);
  EXPECT_EQ(e.store_prefix, "");
  EXPECT_EQ(e.restart_count, 1);
  EXPECT_EQ(e.master_addr, "node-a.example");
  auto t = hp::dist::choose_intra_op_threads(e, 2);
  EXPECT_EQ(t.threads, 2);
  EXPECT_EQ(t.why, "2 cores / 1 local rank");
}

TEST(DistEnv, KubernetesPyTorchJobPlainEnv) {
  // A PyTorchJob's worker pod: the operator sets these five and nothing else.
  auto e = hp::dist::read_dist_env(from({{"MASTER_ADDR", "train-master-0"},
                                         {"MASTER_PORT", "23456"},
                                         {"WORLD_SIZE", "3"},
                                         {"RANK", "2"},
                                         {"PYTHONUNBUFFERED", "0"}}));
  EXPECT_EQ(e.source, "env");
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.world_size, 3);
  EXPECT_EQ(e.master_addr, "train-master-0");
  EXPECT_EQ(e.master_port, 23456);
  EXPECT_FALSE(e.agent_store);
  EXPECT_EQ(hp::dist::describe_launch(e),
            "plain RANK/WORLD_SIZE (no launcher's mark): rank 2 of 3, local 2 of 3, store: served "
            "by rank "
            "0 at train-master-0:23456");
  // No LOCAL_WORLD_SIZE: every rank is taken as local (the cautious split).
  EXPECT_EQ(hp::dist::choose_intra_op_threads(e, 6).why, "6 cores / 3 local ranks");
}

TEST(DistEnv, OpenMpiInsideASlurmAllocationIsOpenMpi) {
  // mpirun in an sbatch script: its daemons' SLURM_PROCID numbers nodes.
  auto e = hp::dist::read_dist_env(from({{"OMPI_COMM_WORLD_RANK", "3"},
                                         {"OMPI_COMM_WORLD_SIZE", "4"},
                                         {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                         {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                         {"SLURM_PROCID", "1"},
                                         {"SLURM_NTASKS", "2"},
                                         {"MASTER_ADDR", "10.0.0.5"},
                                         {"MASTER_PORT", "29600"}}));
  EXPECT_EQ(e.source, "openmpi");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.master_addr, "10.0.0.5");
  EXPECT_EQ(e.master_port, 29600);
  EXPECT_EQ(hp::dist::describe_launch(e),
            "Open MPI: rank 3 of 4, local 1 of 2, store: served by rank 0 at 10.0.0.5:29600");
  EXPECT_EQ(hp::dist::choose_intra_op_threads(e, 4).why, "4 cores / 2 local ranks");
}

TEST(DistEnv, SlurmStepTasksAndMasterAddress) {
  auto e = hp::dist::read_dist_env(from({{"SLURM_PROCID", "5"},
                                         {"SLURM_NTASKS", "6"},
                                         {"SLURM_LOCALID", "2"},
                                         {"SLURM_STEP_TASKS_PER_NODE", "3(x2)"},
                                         {"SLURM_LAUNCH_NODE_IPADDR", "10.1.1.1"},
                                         {"MASTER_ADDR", "10.2.2.2"}}));
  EXPECT_EQ(e.source, "slurm");
  EXPECT_EQ(e.local_rank, 2);
  EXPECT_EQ(e.local_world_size, 3);
  EXPECT_EQ(e.master_addr, "10.2.2.2");  // MASTER_ADDR wins over the launch node
}

TEST(DistEnv, InnerLaunchersWinOverTheOuterOnes) {
  // torchrun (one agent per node) under srun, and hp-launch under mpirun:
  // the outer launcher numbers the agents, the inner one the workers.
  auto t = hp::dist::read_dist_env(from({{"RANK", "3"},
                                         {"WORLD_SIZE", "4"},
                                         {"TORCHELASTIC_RUN_ID", "j1"},
                                         {"SLURM_PROCID", "1"},
                                         {"SLURM_NTASKS", "2"}}));
  EXPECT_EQ(t.source, "torchrun");
  EXPECT_EQ(t.rank, 3);
  auto h = hp::dist::read_dist_env(from({{"RANK", "2"},
                                         {"WORLD_SIZE", "4"},
                                         {"HP_LAUNCHED", "1"},
                                         {"OMPI_COMM_WORLD_RANK", "1"},
                                         {"OMPI_COMM_WORLD_SIZE", "2"}}));
  EXPECT_EQ(h.source, "hp-launch");
  EXPECT_EQ(h.rank, 2);
  // A hand-set RANK that agrees with the launcher is fine.
  auto a = hp::dist::read_dist_env(from({{"RANK", "1"},
                                         {"WORLD_SIZE", "2"},
                                         {"OMPI_COMM_WORLD_RANK", "1"},
                                         {"OMPI_COMM_WORLD_SIZE", "2"}}));
  EXPECT_EQ(a.rank, 1);
}

TEST(DistEnv, ConflictingVariablesAreRefusedNamingBoth) {
  EXPECT_EQ(
      error_of({{"RANK", "0"},
                {"WORLD_SIZE", "2"},
                {"OMPI_COMM_WORLD_RANK", "1"},
                {"OMPI_COMM_WORLD_SIZE", "2"}}),
      "RANK=0 and OMPI_COMM_WORLD_RANK=1 disagree: RANK without a launcher's mark (HP_LAUNCHED, "
      "TORCHELASTIC_RUN_ID) would override Open MPI's place for this process; unset RANK (often "
      "left "
      "exported in the shell) or make it equal to OMPI_COMM_WORLD_RANK");
  auto w = error_of({{"RANK", "1"},
                     {"WORLD_SIZE", "4"},
                     {"OMPI_COMM_WORLD_RANK", "1"},
                     {"OMPI_COMM_WORLD_SIZE", "2"}});
  EXPECT_NE(w.find("WORLD_SIZE=4 and OMPI_COMM_WORLD_SIZE=2 disagree"), std::string::npos) << w;
  auto s =
      error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}});
  EXPECT_NE(s.find("RANK=0 and SLURM_PROCID=1 disagree"), std::string::npos) << s;
  EXPECT_NE(s.find("Slurm's place"), std::string::npos) << s;
  auto n =
      error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "3"}});
  EXPECT_NE(n.find("WORLD_SIZE=2 and SLURM_NTASKS=3 disagree"), std::string::npos) << n;
}

TEST(DistEnv, TorchrunVariablesAreChecked) {
  EXPECT_EQ(error_of({{"RANK", "0"},
                      {"WORLD_SIZE", "2"},
                      {"TORCHELASTIC_RUN_ID", "none"},
                      {"TORCHELASTIC_USE_AGENT_STORE", "True"}}),
            "environment variable TORCHELASTIC_RESTART_COUNT is not set, but "
            "TORCHELASTIC_USE_AGENT_STORE=True is; "
            "set both (hp-launch and torchrun set them all)");
  auto b = error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_USE_AGENT_STORE", "yes"}});
  EXPECT_NE(b.find("TORCHELASTIC_USE_AGENT_STORE='yes' is neither True nor False"),
            std::string::npos)
      << b;
  auto c = error_of({{"RANK", "0"},
                     {"WORLD_SIZE", "2"},
                     {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                     {"TORCHELASTIC_RESTART_COUNT", "-1"}});
  EXPECT_NE(c.find("TORCHELASTIC_RESTART_COUNT='-1' is not a non-negative integer"),
            std::string::npos)
      << c;
  auto alone =
      error_of({{"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"TORCHELASTIC_RESTART_COUNT", "0"}});
  EXPECT_NE(alone.find("RANK and WORLD_SIZE are not"), std::string::npos) << alone;
}

TEST(DistEnv, IntraOpThreadsRule) {
  hp::dist::DistEnv e;
  e.local_world_size = 4;
  EXPECT_EQ(hp::dist::choose_intra_op_threads(e, 2).threads, 1);  // never 0
  EXPECT_EQ(hp::dist::choose_intra_op_threads(e, 2).why, "2 cores / 4 local ranks");
  EXPECT_EQ(hp::dist::choose_intra_op_threads(e, 16).threads, 4);
  auto nested = hp::dist::read_dist_env(from({{"OMP_NUM_THREADS", "3,1"}}));
  EXPECT_EQ(hp::dist::choose_intra_op_threads(nested, 16).threads, 3);
  auto alone = hp::dist::read_dist_env(from({}));
  EXPECT_EQ(hp::dist::choose_intra_op_threads(alone, 2).why, "2 cores / 1 local rank");
  for (const char* bad : {"0", "x", "", "2x"}) {
    auto m = error_of({{"OMP_NUM_THREADS", bad}});
    EXPECT_NE(
        m.find(std::string("OMP_NUM_THREADS='") + bad + "' is not a positive number of threads"),
        std::string::npos)
        << m;
  }
  EXPECT_GE(hp::dist::usable_cores(), 1);
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
