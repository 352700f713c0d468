// Where the process group comes from, and which examples a rank handles
// (asap/dist.h). The collectives themselves run in tests/python/test_distributed.py.
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "asap/dist.h"
#include "asap/error.h"

namespace {

// Sets environment variables for one scope and restores them after.
struct EnvScope {
  std::vector<std::pair<std::string, std::string>> saved;
  std::vector<std::string> unset_after;
  EnvScope(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const char* k : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "TORCHELASTIC_RUN_ID",
                          "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT", "SLURM_PROCID", "SLURM_NTASKS",
                          "SLURM_LOCALID"}) {
      if (const char* v = std::getenv(k)) saved.emplace_back(k, v);
      unsetenv(k);
    }
    for (const auto& [k, v] : vars) setenv(k, v, 1);
  }
  ~EnvScope() {
    for (const char* k : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "TORCHELASTIC_RUN_ID",
                          "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT", "SLURM_PROCID", "SLURM_NTASKS",
                          "SLURM_LOCALID"})
      unsetenv(k);
    for (const auto& [k, v] : saved) setenv(k.c_str(), v.c_str(), 1);
  }
};

}  // namespace

TEST_CASE("dist env: no launcher and no flags is one process") {
  EnvScope env({});
  auto e = asap::resolve_dist_env({});
  CHECK(e.world_size == 1);
  CHECK_FALSE(e.distributed());
  CHECK(e.source == "none");
}

TEST_CASE("dist env: explicit tcp:// flags") {
  EnvScope env({{"RANK", "5"}, {"WORLD_SIZE", "9"}});  // flags win over the environment
  asap::DistOptions o;
  o.init = "tcp://10.0.0.7:29500";
  o.rank = 1;
  o.world_size = 3;
  auto e = asap::resolve_dist_env(o);
  CHECK(e.host == "10.0.0.7");
  CHECK(e.port == 29500);
  CHECK(e.rank == 1);
  CHECK(e.world_size == 3);
  CHECK(e.source == "flags");
  CHECK_FALSE(e.agent_store);

  o.rank = 3;
  CHECK_THROWS_WITH_AS(asap::resolve_dist_env(o), doctest::Contains("rank must be in 0..2, found 3"), asap::Error);
  o.rank = 0;
  o.init = "tcp://host";
  CHECK_THROWS_WITH_AS(asap::resolve_dist_env(o), doctest::Contains("has no port"), asap::Error);
  o.init = "udp://host:1";
  CHECK_THROWS_WITH_AS(asap::resolve_dist_env(o), doctest::Contains("must be tcp://HOST:PORT or env://"), asap::Error);
  o.init = "tcp://host:99999";
  CHECK_THROWS_WITH_AS(asap::resolve_dist_env(o), doctest::Contains("port must be in 1..65535"), asap::Error);
  asap::DistOptions no_init;
  no_init.rank = 0;
  no_init.world_size = 2;
  CHECK_THROWS_WITH_AS(asap::resolve_dist_env(no_init), doctest::Contains("need --dist-init"), asap::Error);
}

TEST_CASE("dist env: torchrun's variables, with its agent's store") {
  EnvScope env({{"RANK", "1"},
                {"WORLD_SIZE", "2"},
                {"LOCAL_RANK", "1"},
                {"MASTER_ADDR", "127.0.0.1"},
                {"MASTER_PORT", "29400"},
                {"TORCHELASTIC_RUN_ID", "none"},
                {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                {"TORCHELASTIC_RESTART_COUNT", "2"}});
  auto e = asap::resolve_dist_env({});
  CHECK(e.distributed());
  CHECK(e.rank == 1);
  CHECK(e.local_rank == 1);
  CHECK(e.port == 29400);
  CHECK(e.source == "torchrun");
  CHECK(e.agent_store);
  CHECK(e.store_prefix == "/worker/attempt_2");
}

TEST_CASE("dist env: missing or malformed variables are named") {
  {
    EnvScope env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}});
    CHECK_THROWS_WITH_AS(asap::resolve_dist_env({}), doctest::Contains("MASTER_PORT is not set"), asap::Error);
  }
  {
    EnvScope env({{"RANK", "x"}, {"WORLD_SIZE", "2"}});
    CHECK_THROWS_WITH_AS(asap::resolve_dist_env({}), doctest::Contains("environment variable RANK"), asap::Error);
  }
  {
    EnvScope env({});
    asap::DistOptions o;
    o.init = "env://";
    CHECK_THROWS_WITH_AS(asap::resolve_dist_env(o), doctest::Contains("needs RANK and WORLD_SIZE"), asap::Error);
  }
}

TEST_CASE("dist env: SLURM joins only when the job names the rendezvous") {
  {
    EnvScope env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}});
    CHECK(asap::resolve_dist_env({}).world_size == 1);  // a batch script's own process, not a group
  }
  {
    EnvScope env({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"MASTER_ADDR", "node1"}, {"MASTER_PORT", "29500"}});
    auto e = asap::resolve_dist_env({});
    CHECK(e.source == "slurm");
    CHECK(e.rank == 3);
    CHECK(e.world_size == 4);
    CHECK(e.host == "node1");
  }
}

TEST_CASE("shards: a rank's part of a list, split among the ranks sharing files") {
  asap::Shards sh;
  sh.total = 100;
  sh.readable_begin = 0;
  sh.readable_end = 100;
  std::vector<int64_t> held;
  for (int64_t e = 0; e < 100; e += 3) held.push_back(e);  // 34 indices
  std::vector<int64_t> joined;
  for (int r = 0; r < 3; ++r) {
    sh.group_rank = r;
    sh.group_size = 3;
    auto m = sh.mine(held);
    CHECK(m.size() >= 11);
    CHECK(m.size() <= 12);
    joined.insert(joined.end(), m.begin(), m.end());
  }
  CHECK(joined == held);  // disjoint, complete, in order

  // A rank whose files hold examples 40..69 alone.
  sh.readable_begin = 40;
  sh.readable_end = 70;
  sh.group_rank = 0;
  sh.group_size = 1;
  auto m = sh.mine(held);
  REQUIRE_FALSE(m.empty());
  CHECK(m.front() == 42);
  CHECK(m.back() == 69);
}
