#include "common.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cmath>
#include <thread>

namespace asapc {

void set_threads(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(threads);
  // asapc parallelises over (batch, head) and rows with OpenMP; OpenBLAS's
  // own thread pool on top of that only spins in sched_yield between the
  // small GEMMs left to it (40% of a compile's CPU time on 2 cores). One
  // BLAS thread; looked up at run time so other BLAS builds are unaffected
  // (docs/decisions.md).
  using SetThreads = void (*)(int);
  if (auto f = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) f(1);
}

std::string human_seconds(double s) {
  char buf[32];
  if (s < 1) std::snprintf(buf, sizeof buf, "%.0f ms", s * 1e3);
  else if (s < 120) std::snprintf(buf, sizeof buf, "%.1f s", s);
  else std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  return buf;
}

Progress::Progress(bool quiet) : enabled_(!quiet && isatty(STDERR_FILENO)) {}
Progress::~Progress() { finish(); }

void Progress::update(const std::string& label, long long done, long long total) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (label != label_) {
    label_ = label;
    start_ = now;
  }
  const double el = std::chrono::duration<double>(now - start_).count();
  const double frac = total > 0 ? std::min(1.0, static_cast<double>(done) / static_cast<double>(total)) : 0;
  const int width = 28, full = static_cast<int>(std::lround(frac * width));
  std::string bar(full, '#');
  bar += std::string(width - full, '.');
  std::string eta = done > 0 && frac < 1 ? "ETA " + human_seconds(el / frac - el) : human_seconds(el);
  std::fprintf(stderr, "\r\033[K%s [%s] %lld/%lld %s", label.c_str(), bar.c_str(), done, total, eta.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::finish() {
  if (enabled_ && drawn_) std::fprintf(stderr, "\r\033[K");
  drawn_ = false;
  label_.clear();
}

}  // namespace asapc
