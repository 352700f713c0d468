// Where the process group is (flags, torchrun, SLURM) and which examples
// each rank reads (asap/dist.h).
#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "asap/calib.h"
#include "asap/checkpoint.h"
#include "asap/dist.h"
#include "asap/error.h"

namespace asap {

namespace {

const char* env_of(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int int_of(const std::string& text, const std::string& what) {
  size_t pos = 0;
  long v = -1;
  try {
    v = std::stol(text, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  ASAP_CHECK(pos == text.size() && pos > 0 && v >= 0 && v <= 1 << 30, what,
             " should be a non-negative integer, found '", text, "'");
  return static_cast<int>(v);
}

int env_int(const char* name) { return int_of(env_of(name), str("environment variable ", name)); }

// MASTER_ADDR and MASTER_PORT, which every launcher but the flags provides.
void master_from_env(DistEnv& e, const std::string& who) {
  const char* a = env_of("MASTER_ADDR");
  const char* p = env_of("MASTER_PORT");
  ASAP_CHECK(a && p, who, " gives RANK ", e.rank, " of WORLD_SIZE ", e.world_size, " but ",
             a ? "MASTER_PORT" : "MASTER_ADDR",
             " is not set: it names the rendezvous host and port (docs/distributed.md)");
  e.host = a;
  e.port = env_int("MASTER_PORT");
}

void check_rank(const DistEnv& e, const std::string& who) {
  ASAP_CHECK(e.world_size >= 1, who, ": the world size must be at least 1, found ", e.world_size);
  ASAP_CHECK(e.rank >= 0 && e.rank < e.world_size, who, ": the rank must be in 0..", e.world_size - 1, ", found ",
             e.rank);
  ASAP_CHECK(e.world_size == 1 || (e.port >= 1 && e.port <= 65535), who, ": the port must be in 1..65535, found ",
             e.port);
}

}  // namespace

DistEnv resolve_dist_env(const DistOptions& opt) {
  DistEnv e;
  const bool flags = opt.rank >= 0 || opt.world_size >= 0;
  if (!opt.init.empty() && opt.init != "env://") {
    const std::string prefix = "tcp://";
    ASAP_CHECK(opt.init.compare(0, prefix.size(), prefix) == 0,
               "--dist-init must be tcp://HOST:PORT or env://, found '", opt.init, "'");
    const std::string hp = opt.init.substr(prefix.size());
    const auto colon = hp.rfind(':');
    ASAP_CHECK(colon != std::string::npos && colon > 0, "--dist-init '", opt.init,
               "' has no port: expected tcp://HOST:PORT");
    ASAP_CHECK(opt.rank >= 0 && opt.world_size >= 1, "--dist-init ", opt.init,
               " needs --rank R and --world-size W (or use env:// under torchrun)");
    e.host = hp.substr(0, colon);
    if (e.host.size() > 2 && e.host.front() == '[' && e.host.back() == ']')
      e.host = e.host.substr(1, e.host.size() - 2);
    e.port = int_of(hp.substr(colon + 1), str("the port of --dist-init '", opt.init, "'"));
    e.rank = opt.rank;
    e.world_size = opt.world_size;
    e.source = "flags";
    check_rank(e, "--dist-init");
    return e;
  }
  ASAP_CHECK(!flags || opt.init == "env://", "--rank and --world-size need --dist-init tcp://HOST:PORT");
  if (env_of("RANK") && env_of("WORLD_SIZE")) {
    e.rank = env_int("RANK");
    e.world_size = env_int("WORLD_SIZE");
    e.local_rank = env_of("LOCAL_RANK") ? env_int("LOCAL_RANK") : 0;
    e.source = env_of("TORCHELASTIC_RUN_ID") ? "torchrun" : "env";
    if (e.world_size > 1) master_from_env(e, e.source == "torchrun" ? "torchrun" : "the environment");
    if (const char* a = env_of("TORCHELASTIC_USE_AGENT_STORE"); a && std::string(a) == "True") {
      e.agent_store = true;
      e.store_prefix =
          str("/worker/attempt_", env_of("TORCHELASTIC_RESTART_COUNT") ? env_of("TORCHELASTIC_RESTART_COUNT") : "0");
    }
    check_rank(e, e.source);
    return e;
  }
  ASAP_CHECK(opt.init != "env://",
             "--dist-init env:// needs RANK and WORLD_SIZE in the environment (torchrun sets them)");
  // SLURM: srun sets the task's rank and count; the job script names the
  // rendezvous with MASTER_ADDR / MASTER_PORT, which is what opts in.
  if (env_of("SLURM_PROCID") && env_of("SLURM_NTASKS") && env_of("MASTER_ADDR") && env_of("MASTER_PORT")) {
    e.rank = env_int("SLURM_PROCID");
    e.world_size = env_int("SLURM_NTASKS");
    e.local_rank = env_of("SLURM_LOCALID") ? env_int("SLURM_LOCALID") : 0;
    e.source = "slurm";
    if (e.world_size > 1) master_from_env(e, "SLURM");
    check_rank(e, "SLURM");
    return e;
  }
  e.source = "none";
  return e;
}

std::vector<int64_t> Shards::mine(const std::vector<int64_t>& global) const {
  std::vector<int64_t> readable;
  for (int64_t g : global)
    if (g >= readable_begin && g < readable_end) readable.push_back(g);
  const size_t n = readable.size(), a = n * static_cast<size_t>(group_rank) / static_cast<size_t>(group_size),
               b = n * static_cast<size_t>(group_rank + 1) / static_cast<size_t>(group_size);
  return std::vector<int64_t>(readable.begin() + static_cast<std::ptrdiff_t>(a),
                              readable.begin() + static_cast<std::ptrdiff_t>(b));
}

std::string calib_content_digest(const CalibFile& calib) {
  // Sampled bytes: the first and last MiB (superblock, metadata, the first
  // and last chunks) and 62 blocks of 16 KiB evenly spread between them.
  constexpr uint64_t kEnd = 1 << 20, kBlock = 16 << 10, kBlocks = 62;
  std::string all;
  for (const auto& path : calib.paths()) {
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(path, ec);
    ASAP_CHECK(!ec, "calibration file '", path, "': cannot read its size to compare it with the other ranks' (",
               ec.message(), ")");
    std::ifstream in(path, std::ios::binary);
    ASAP_CHECK(in.good(), "calibration file '", path, "' cannot be opened to compare it with the other ranks'");
    std::string sample;
    auto take = [&](uint64_t at, uint64_t len) {
      if (at >= size) return;
      len = std::min(len, size - at);
      std::string buf(static_cast<size_t>(len), '\0');
      in.seekg(static_cast<std::streamoff>(at));
      in.read(buf.data(), static_cast<std::streamsize>(len));
      ASAP_CHECK(in.gcount() == static_cast<std::streamsize>(len), "calibration file '", path,
                 "' could not be read at byte ", at, " (", size, " bytes) to compare it with the other ranks'");
      sample += buf;
    };
    if (size <= 2 * kEnd + kBlocks * kBlock) {
      take(0, size);  // small: all of it
    } else {
      take(0, kEnd);
      const uint64_t span = size - 2 * kEnd - kBlock;
      for (uint64_t b = 0; b < kBlocks; ++b) take(kEnd + span * b / (kBlocks - 1), kBlock);
      take(size - kEnd, kEnd);
    }
    all += str("file ", size, " bytes ", sha256_hex(sample.data(), sample.size()), "\n");
  }
  for (const auto& layer : calib.layer_names()) {
    const auto li = calib.info(layer);
    all +=
        str("layer ", layer, " projected ", li.projected, " v ", li.has_v, " mask ", li.has_mask, " n ", li.n,
            " d_model ", li.d_model, " heads ", li.heads, " head_dim ", li.head_dim, " value_dim ", li.value_dim, " N");
    for (int64_t n : calib.examples_per_file(layer)) all += str(" ", n);
    all += "\n";
  }
  return sha256_hex(all.data(), all.size());
}

Shards make_shards(Communicator* comm, const CalibFile& calib, int64_t local_n, int64_t max_examples) {
  Shards sh;
  if (!comm) {
    sh.total = max_examples > 0 ? std::min(local_n, max_examples) : local_n;
    sh.readable_end = sh.end = sh.total;
    sh.examples_per_rank = {sh.total};
    return sh;
  }
  const int W = comm->world_size();
  const int R = comm->rank();
  // Which files each rank holds, by content (calib_content_digest): the same
  // path on two machines may hold two different shards, and each must then
  // be read in full by its own rank.
  const auto all = comm->allgather(calib_content_digest(calib) + " " + std::to_string(local_n));
  std::vector<std::string> digest(static_cast<size_t>(W));
  std::vector<int64_t> count(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) {
    const std::string& x = all[static_cast<size_t>(r)];
    const auto sp = x.find(' ');
    ASAP_CHECK(sp != std::string::npos, "rank ", r, " sent a malformed calibration digest '", x, "'");
    digest[static_cast<size_t>(r)] = x.substr(0, sp);
    count[static_cast<size_t>(r)] = std::stoll(x.substr(sp + 1));
  }
  auto same = [&](int a, int b) { return digest[static_cast<size_t>(a)] == digest[static_cast<size_t>(b)]; };
  auto n_of = [&](int r) { return count[static_cast<size_t>(r)]; };
  // Groups of consecutive ranks with the same files, numbered in rank order.
  std::vector<int64_t> group_begin(static_cast<size_t>(W)), group_n(static_cast<size_t>(W));
  std::vector<int> first_of(static_cast<size_t>(W)), size_of(static_cast<size_t>(W));
  int64_t offset = 0;
  for (int r = 0; r < W;) {
    int e = r + 1;
    while (e < W && same(r, e)) ++e;
    for (int later = e; later < W; ++later)
      ASAP_CHECK(!same(r, later), "ranks ", r, " and ", later, " were given the same calibration files but rank ", e,
                 " others: ranks that share files must be consecutive (docs/distributed.md)");
    ASAP_CHECK(n_of(r) == n_of(e - 1), "ranks ", r, " and ", e - 1,
               " were given the same calibration files but see different example counts");
    for (int x = r; x < e; ++x) {
      group_begin[x] = offset;
      group_n[x] = n_of(r);
      first_of[x] = r;
      size_of[x] = e - r;
    }
    offset += n_of(r);
    r = e;
  }
  sh.total = max_examples > 0 ? std::min(offset, max_examples) : offset;
  for (int r = 0; r < W; ++r) {
    const int64_t rb = std::min(group_begin[r], sh.total), re = std::min(group_begin[r] + group_n[r], sh.total);
    const int gr = r - first_of[r], gs = size_of[r];
    const int64_t b = rb + (re - rb) * gr / gs, e = rb + (re - rb) * (gr + 1) / gs;
    sh.examples_per_rank.push_back(e - b);
    if (r == R) {
      sh.readable_begin = rb;
      sh.readable_end = re;
      sh.group_rank = gr;
      sh.group_size = gs;
      sh.begin = b;
      sh.end = e;
    }
  }
  return sh;
}

void sum_over_ranks(Communicator* comm, std::vector<double>& v) {
  if (comm) comm->allreduce_sum(v);
}

void require_same_start(Communicator& comm, const std::string& fields_json,
                        const std::vector<std::pair<std::string, std::string>>& object_labels,
                        const std::string& purpose) {
  using nlohmann::json;
  const auto all = comm.allgather(fields_json);
  const json root = json::parse(all[0]);
  auto brief = [](const json& v) {
    std::string s = v.dump();
    return s.size() > 40 ? s.substr(0, 37) + "..." : s;
  };
  for (size_t r = 1; r < all.size(); ++r) {
    const json other = json::parse(all[r]);
    for (const auto& [field, value] : root.items()) {
      const json theirs = other.value(field, json());
      if (theirs == value) continue;
      std::string what = field, a = brief(theirs), b = brief(value);
      for (const auto& [f, label] : object_labels) {
        if (f != field || !theirs.is_object() || !value.is_object()) continue;
        for (const auto& [k, v] : value.items())
          if (theirs.value(k, json()) != v) {
            what = label + " " + k;
            a = brief(theirs.value(k, json()));
            b = brief(v);
            break;
          }
      }
      throw Error(str("rank ", r, " was started with ", what, " = ", a, " but rank 0 with ", b, ": ", purpose));
    }
  }
}

}  // namespace asap
