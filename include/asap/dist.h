// asap/dist.h -- compile and verify across processes and machines on
// PyTorch's distributed engine (c10d's ProcessGroupGloo with a TCPStore
// rendezvous), launched by torchrun, SLURM or explicit flags
// (docs/distributed.md).
//
// Every quantity compile keeps is a sum over examples, so each process
// streams its share of the calibration examples and an allreduce turns the
// shares into what one process would have computed. Without a process group
// (world size 1) nothing here runs and nothing changes.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace asap {

class CalibFile;

// How the user asked to join a group (flags of asapc compile / verify).
struct DistOptions {
  std::string init;  // "tcp://host:port", "env://" or empty (read the environment)
  int rank = -1;     // with --dist-init tcp://...
  int world_size = -1;
  double timeout_s = 300;  // a rank that stops or hangs ends every rank within this
};

// Where the group is: from the flags, else torchrun's env:// variables
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK), else SLURM's
// (SLURM_PROCID, SLURM_NTASKS, with MASTER_ADDR and MASTER_PORT).
struct DistEnv {
  int rank = 0, world_size = 1, local_rank = 0;
  std::string host;
  int port = 0;
  bool agent_store = false;  // torchrun's agent hosts the store (TORCHELASTIC_USE_AGENT_STORE)
  std::string store_prefix;  // "/worker/attempt_N" under the agent store
  std::string source;        // "flags", "torchrun", "env", "slurm" or "none"
  bool distributed() const { return world_size > 1; }
};
// Throws asap::Error naming the variable or flag that is missing or malformed.
DistEnv resolve_dist_env(const DistOptions& opt);

// A process group. All collectives are blocking and must be called by every
// rank in the same order.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Sums v over ranks in place, in float64; every rank ends with the same values.
  virtual void allreduce_sum(std::vector<double>& v) = 0;
  // Rank `root`'s v to every rank (v must have the same size everywhere).
  virtual void broadcast(std::vector<double>& v, int root) = 0;
  // Every rank's string, in rank order.
  virtual std::vector<std::string> allgather(const std::string& s) = 0;
  virtual void barrier() = 0;
  // Adds delta to a counter shared by all ranks and returns its total (progress).
  virtual int64_t add_counter(const std::string& key, int64_t delta) = 0;
  // Tells every rank that this one failed; they stop, naming this rank and
  // the message, within the timeout.
  virtual void report_failure(const std::string& message) = 0;

  struct Stats {
    double comm_seconds = 0;  // wall time inside collectives (waiting for other ranks included)
    int64_t bytes_reduced = 0;
    int64_t collectives = 0;
  };
  virtual Stats stats() const = 0;
};

// Joins the group (rendezvous within opt.timeout_s). Null for world size 1.
// While joined, a watcher ends this process (exit code 3, one sentence on
// stderr) when another rank reports a failure or stops responding.
std::shared_ptr<Communicator> join_process_group(const DistEnv& env, double timeout_s);

// The end of a successful run: a barrier after which no rank is declared
// lost while the ranks exit. Every rank calls it once, last.
void finish_process_group(Communicator* comm);

// The joined group of this process, or null (used by the CLI's error path).
Communicator* active_communicator();

// Start-up agreement of compile and verify: `fields_json` is a JSON object of
// what every rank must share (versions, file hashes, options). Each rank's is
// compared with rank 0's; the first difference throws one sentence: "rank R
// was started with WHAT = A but rank 0 with B: PURPOSE", where WHAT is the
// field, or for an object field listed in `object_labels` (field -> label)
// "LABEL KEY" of its first differing key.
void require_same_start(Communicator& comm, const std::string& fields_json,
                        const std::vector<std::pair<std::string, std::string>>& object_labels,
                        const std::string& purpose);

// The longest --dist-timeout: one week, in seconds (the group's timeouts
// are milliseconds in an int64 and in c10d's options).
constexpr double kMaxDistTimeoutS = 7 * 24 * 3600.0;

// Exit code of a rank stopped because another rank failed.
constexpr int kExitOtherRankFailed = 3;

// Which calibration examples this rank reads. Examples are numbered through
// the whole calibration set; ranks that were given the same files share
// them evenly, and ranks given different files (machines with local shards)
// each read their own, numbered in rank order. "The same files" means the
// same content (calib_content_digest), whatever their paths: two machines
// that each hold their own shard at /data/calib.h5 each read theirs in full.
struct Shards {
  int64_t total = 0;                             // examples in the whole set (after --max-examples)
  int64_t readable_begin = 0, readable_end = 0;  // global indices held by this rank's files
  int group_rank = 0, group_size = 1;            // ranks sharing this rank's files
  int64_t begin = 0, end = 0;                    // this rank's contiguous share, for streaming
  std::vector<int64_t> examples_per_rank;        // share sizes, rank order (summary)
  // The members of a sorted list of global indices that this rank handles:
  // those its files hold, split into contiguous blocks among its group.
  std::vector<int64_t> mine(const std::vector<int64_t>& global) const;
};
// A SHA-256 (hex) of what a calibration set holds: per file in order, its
// size and a hash of sampled bytes (the first and last MiB and 62 blocks of
// 16 KiB spread between; all of a file up to 3 MiB), then each layer's
// shapes and example count per file. Paths are not part of it: the same
// file under two mount points is the same data (docs/decisions.md).
std::string calib_content_digest(const CalibFile& calib);

// Single process: everything is readable and mine. With a communicator,
// agrees the numbering across ranks (a collective). `local_n` is the layer's
// N in this rank's files; max_examples > 0 caps the global count.
Shards make_shards(Communicator* comm, const CalibFile& calib, int64_t local_n, int64_t max_examples);

// Sums v over ranks when comm is set; nothing otherwise.
void sum_over_ranks(Communicator* comm, std::vector<double>& v);

}  // namespace asap
