// Shared pieces of the asapc subcommands.
#pragma once
#include <chrono>
#include <cstdio>
#include <string>

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

}  // namespace asapc
