// Shared pieces of the asapc subcommands.
#pragma once
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "asap/compile.h"
#include "asap/dist.h"

namespace CLI {
class App;
}

namespace asapc {

// Exit codes: 0 ok, 1 a verify threshold was exceeded, 2 bad input or usage.
constexpr int kExitThreshold = 1;
constexpr int kExitBadInput = 2;

// Sets LibTorch's intra-op threads: 0 = all cores of the machine.
void set_threads(int threads);

// A one-line progress bar with rate and ETA on stderr; silent when stderr is
// not a terminal or when quiet.
class Progress {
 public:
  explicit Progress(bool quiet);
  ~Progress();
  void update(const std::string& label, long long done, long long total);
  void finish();

 private:
  bool enabled_;
  bool drawn_ = false;
  std::string label_;
  std::chrono::steady_clock::time_point start_;
};

std::string human_seconds(double s);

// Checks of given option values after parsing (the defaults carry internal
// sentinels such as -1 = "choose", which a user must not pass). Each refuses
// with one sentence naming the flag, what it takes and the text given.
enum class Takes { kNonNegative, kPositive, kNonNegativeInt, kPositiveInt, kThreads, kThreshold, kDistTimeout };
void require_values(CLI::App* cmd, std::initializer_list<std::pair<const char*, Takes>> flags);
// Refuses an option given an empty value ("--x ''" or "--x="), before parsing.
void refuse_empty_values(int argc, char** argv);

// --dist-init, --rank, --world-size, --dist-timeout (docs/distributed.md).
void add_dist_options(CLI::App* cmd, asap::DistOptions& o);
// Joins the process group the flags or the environment describe; null when
// there is none (one process).
std::shared_ptr<asap::Communicator> join_group(const asap::DistOptions& o);
// set_threads for one rank: --threads when given, else OMP_NUM_THREADS when
// set (torchrun sets it), else the cores shared among the ranks on this host.
void set_rank_threads(int threads, asap::Communicator* comm);

// File arguments with glob patterns (*, ?, [) expanded, sorted; a pattern
// that matches nothing is an error naming the flag.
std::vector<std::string> expand_files(const std::vector<std::string>& args, const char* flag);

// Progress across ranks: each rank adds what it did to a counter shared
// through the rendezvous store, and rank 0 draws the total. `stage` keeps
// the counters of successive runs over the same layers apart.
class GroupProgress {
 public:
  GroupProgress(Progress& bar, asap::Communicator* comm) : bar_(bar), comm_(comm) {}
  void set_stage(const std::string& stage) { stage_ = stage; }
  void operator()(const asap::ProgressEvent& e);

 private:
  Progress& bar_;
  asap::Communicator* comm_;
  std::string stage_;
  std::map<std::string, long long> last_;
};

}  // namespace asapc
