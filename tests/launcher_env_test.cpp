// Rank identity from launcher environments: pure functions of an environment map.
#include <gtest/gtest.h>

#include <cstdlib>

#include "comm/launcher_env.h"
#include "common/error.h"

using namespace pipetrain;
using namespace pipetrain::comm;

namespace {

std::string config_error(const Environment& env) {
  try {
    rank_from_env(env);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(LauncherEnv, NoLauncherIsOneProcess) {
  const RankInfo i = rank_from_env({});
  EXPECT_EQ(i.launcher, "none");
  EXPECT_EQ(i.rank, 0);
  EXPECT_EQ(i.world_size, 1);
  EXPECT_EQ(i.local_rank, 0);
  EXPECT_EQ(i.master_addr, "127.0.0.1");
  EXPECT_EQ(i.master_port, 29500);
}

TEST(LauncherEnv, Torchrun) {
  const RankInfo i = rank_from_env({{"RANK", "2"},
                                    {"WORLD_SIZE", "4"},
                                    {"LOCAL_RANK", "0"},
                                    {"MASTER_ADDR", "n1"},
                                    {"MASTER_PORT", "1234"}});
  EXPECT_EQ(i.launcher, "torchrun");
  EXPECT_EQ(i.rank, 2);
  EXPECT_EQ(i.world_size, 4);
  EXPECT_EQ(i.local_rank, 0);
  EXPECT_EQ(i.local_world_size, 0);  // not given
  EXPECT_EQ(i.master_addr, "n1");
  EXPECT_EQ(i.master_port, 1234);
  EXPECT_EQ(rank_from_env({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "n1"}, {"LOCAL_WORLD_SIZE", "2"}})
                .local_world_size,
            2);
  EXPECT_NE(config_error({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "n1"}, {"LOCAL_WORLD_SIZE", "5"}})
                .find("LOCAL_WORLD_SIZE=5 is outside [1, 4]"),
            std::string::npos);
  // LOCAL_RANK is optional; a single process needs no master address.
  EXPECT_EQ(rank_from_env({{"RANK", "0"}, {"WORLD_SIZE", "1"}}).master_addr, "127.0.0.1");
}

TEST(LauncherEnv, TorchrunErrorsNameTheVariable) {
  EXPECT_NE(config_error({{"RANK", "1"}}).find("WORLD_SIZE is not set but RANK is"), std::string::npos);
  EXPECT_NE(config_error({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}})
                .find("RANK=4 but WORLD_SIZE=4"),
            std::string::npos);
  EXPECT_NE(config_error({{"RANK", "one"}, {"WORLD_SIZE", "4"}}).find("RANK=one is not an integer"),
            std::string::npos);
  EXPECT_NE(config_error({{"RANK", "1x"}, {"WORLD_SIZE", "4"}}).find("not an integer"), std::string::npos);
  EXPECT_NE(config_error({{"RANK", "-1"}, {"WORLD_SIZE", "4"}}).find("RANK=-1 is outside"),
            std::string::npos);
  EXPECT_NE(config_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}}).find("WORLD_SIZE=0 is outside"),
            std::string::npos);
  EXPECT_NE(config_error({{"RANK", "0"}, {"WORLD_SIZE", "99999999999"}}).find("WORLD_SIZE=99999999999"),
            std::string::npos);
  EXPECT_NE(config_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}}).find("MASTER_ADDR is not set"),
            std::string::npos);
  EXPECT_NE(config_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", ""}})
                .find("MASTER_ADDR is set but empty"),
            std::string::npos);
  EXPECT_NE(config_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}})
                .find("MASTER_PORT=70000 is outside [1, 65535]"),
            std::string::npos);
  EXPECT_NE(config_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"LOCAL_RANK", "2"}})
                .find("LOCAL_RANK=2 but WORLD_SIZE=2"),
            std::string::npos);
}

TEST(LauncherEnv, OpenMpi) {
  Environment env{{"OMPI_COMM_WORLD_RANK", "3"},
                  {"OMPI_COMM_WORLD_SIZE", "4"},
                  {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}};
  RankInfo i = rank_from_env(env);
  EXPECT_EQ(i.launcher, "openmpi");
  EXPECT_EQ(i.rank, 3);
  EXPECT_EQ(i.world_size, 4);
  EXPECT_EQ(i.local_rank, 3);
  EXPECT_EQ(i.local_world_size, 4);
  EXPECT_EQ(i.master_addr, "127.0.0.1");    // every rank on this host
  env["OMPI_COMM_WORLD_LOCAL_SIZE"] = "2";  // two hosts: rank 0's host must be given
  EXPECT_NE(config_error(env).find("mpirun -x MASTER_ADDR"), std::string::npos);
  env["MASTER_ADDR"] = "head";
  EXPECT_EQ(rank_from_env(env).master_addr, "head");
  EXPECT_NE(config_error({{"OMPI_COMM_WORLD_RANK", "0"}}).find("OMPI_COMM_WORLD_SIZE is not set"),
            std::string::npos);
}

TEST(LauncherEnv, Slurm) {
  Environment env{{"SLURM_PROCID", "5"},
                  {"SLURM_NTASKS", "8"},
                  {"SLURM_LOCALID", "1"},
                  {"SLURM_JOB_NODELIST", "node[01-04]"},
                  {"SLURM_NODELIST", "other"}};
  RankInfo i = rank_from_env(env);
  EXPECT_EQ(i.launcher, "slurm");
  EXPECT_EQ(i.rank, 5);
  EXPECT_EQ(i.world_size, 8);
  EXPECT_EQ(i.local_rank, 1);
  EXPECT_EQ(i.local_world_size, 0);
  EXPECT_EQ(i.master_addr, "node01");
  EXPECT_EQ(i.master_port, 29500);
  env.erase("SLURM_JOB_NODELIST");
  env["SLURM_NODELIST"] = "a,b";
  EXPECT_EQ(rank_from_env(env).master_addr, "a");
  env["MASTER_ADDR"] = "10.0.0.7";  // an explicit address wins over the node list
  env["MASTER_PORT"] = "4000";
  EXPECT_EQ(rank_from_env(env).master_addr, "10.0.0.7");
  EXPECT_EQ(rank_from_env(env).master_port, 4000);
  env["SLURM_NTASKS_PER_NODE"] = "2";
  EXPECT_EQ(rank_from_env(env).local_world_size, 2);
  env["SLURM_NTASKS_PER_NODE"] = "2(x4)";  // an uneven layout's notation: not known
  EXPECT_EQ(rank_from_env(env).local_world_size, 0);
  // SLURM_NPROCS stands in for SLURM_NTASKS; without any node list the host is unknown.
  EXPECT_EQ(rank_from_env({{"SLURM_PROCID", "0"}, {"SLURM_NPROCS", "2"}, {"SLURM_NODELIST", "x"}}).world_size,
            2);
  EXPECT_NE(config_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}).find("SLURM_JOB_NODELIST"),
            std::string::npos);
  EXPECT_NE(config_error({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "2"}, {"SLURM_NODELIST", "x"}})
                .find("SLURM_PROCID=2 but SLURM_NTASKS=2"),
            std::string::npos);
}

TEST(LauncherEnv, PrecedenceTorchrunThenOpenMpiThenSlurm) {
  Environment env{{"RANK", "1"},
                  {"WORLD_SIZE", "2"},
                  {"MASTER_ADDR", "h"},
                  {"OMPI_COMM_WORLD_RANK", "0"},
                  {"OMPI_COMM_WORLD_SIZE", "2"},
                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                  {"SLURM_PROCID", "0"},
                  {"SLURM_NTASKS", "1"}};
  EXPECT_EQ(rank_from_env(env).launcher, "torchrun");
  EXPECT_EQ(rank_from_env(env).rank, 1);
  env.erase("RANK");
  EXPECT_EQ(rank_from_env(env).launcher, "openmpi");  // mpirun inside a Slurm batch step
  EXPECT_EQ(rank_from_env(env).rank, 0);
  env.erase("OMPI_COMM_WORLD_RANK");
  EXPECT_EQ(rank_from_env(env).launcher, "slurm");
}

TEST(LauncherEnv, FirstSlurmHost) {
  EXPECT_EQ(first_slurm_host("node01"), "node01");
  EXPECT_EQ(first_slurm_host("a,b,c"), "a");
  EXPECT_EQ(first_slurm_host("node[01-04]"), "node01");
  EXPECT_EQ(first_slurm_host("node[07,01-04]"), "node07");
  EXPECT_EQ(first_slurm_host("gpu-[3,5],cpu[1-2]"), "gpu-3");
  EXPECT_EQ(first_slurm_host("rack[2-3]-n[05-06]"), "rack2-n05");
  EXPECT_THROW(first_slurm_host(""), ConfigError);
  EXPECT_THROW(first_slurm_host("node[01-"), ConfigError);
  EXPECT_THROW(first_slurm_host("node[]"), ConfigError);
}

TEST(LauncherEnv, ReadsTheProcessEnvironment) {
  ::setenv("PIPETRAIN_RENDEZVOUS_TEST", "a=b", 1);
  const Environment env = process_environment();
  ASSERT_TRUE(env.count("PIPETRAIN_RENDEZVOUS_TEST"));
  EXPECT_EQ(env.at("PIPETRAIN_RENDEZVOUS_TEST"), "a=b");
  ::unsetenv("PIPETRAIN_RENDEZVOUS_TEST");
}

// The job's identity: pipetrain launch's token first, then torchrun's, Slurm's and OpenMPI's
// job ids; none without a launcher that gives one.
TEST(LauncherEnv, RunTokenIdentifiesTheJob) {
  Environment env{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}};
  EXPECT_EQ(rank_from_env(env).run_token, "");
  env["PMIX_NAMESPACE"] = "prterun-h-123@1";
  EXPECT_EQ(rank_from_env(env).run_token, "openmpi:prterun-h-123@1");
  env["SLURM_JOB_ID"] = "77";
  env["SLURM_STEP_ID"] = "0";
  EXPECT_EQ(rank_from_env(env).run_token, "slurm:77.0");
  env["TORCHELASTIC_RUN_ID"] = "none";
  EXPECT_EQ(rank_from_env(env).run_token, "torchrun:none");
  env["PIPETRAIN_RUN_TOKEN"] = "launch:1:2:3";
  EXPECT_EQ(rank_from_env(env).run_token, "launch:1:2:3");
  env["PIPETRAIN_RUN_TOKEN"] = std::string(300, 'x');
  EXPECT_NE(config_error(env).find("over 256 bytes"), std::string::npos);
}

}  // namespace
