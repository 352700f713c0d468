#include "common.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <unistd.h>

#include <glob.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <thread>

#include "asap/error.h"

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
  if (s < 1)
    std::snprintf(buf, sizeof buf, "%.0f ms", s * 1e3);
  else if (s < 120)
    std::snprintf(buf, sizeof buf, "%.1f s", s);
  else
    std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
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

void refuse_empty_values(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool opt = a.size() > 1 && a[0] == '-' && !(a[1] >= '0' && a[1] <= '9') && a[1] != '.';
    ASAP_CHECK(!(opt && a.back() == '=' && a.find('=') == a.size() - 1), a.substr(0, a.size() - 1),
               " was given an empty value");
    ASAP_CHECK(!(a.empty() && i > 1 && std::string(argv[i - 1]).rfind("--", 0) == 0), argv[i - 1],
               " was given an empty value");
  }
}

void require_values(CLI::App* cmd, std::initializer_list<std::pair<const char*, Takes>> flags) {
  for (const auto& [flag, takes] : flags) {
    const CLI::Option* o = cmd->get_option_no_throw(flag);
    if (!o || o->count() == 0) continue;
    for (const std::string& text : o->results()) {
      if (text.empty()) continue;  // list delimiters; empty values are refused before parsing
      double v = std::numeric_limits<double>::quiet_NaN();
      size_t pos = 0;
      try {
        v = std::stod(text, &pos);
      } catch (const std::exception&) {
        pos = 0;
      }
      const bool number = pos == text.size() && std::isfinite(v);
      const bool integer = number && v == std::floor(v);
      bool ok = false;
      const char* what = "";
      switch (takes) {
        case Takes::kNonNegative:
          ok = number && v >= 0, what = "a finite number >= 0";
          break;
        case Takes::kPositive:
          ok = number && v > 0, what = "a finite number > 0";
          break;
        case Takes::kNonNegativeInt:
          ok = integer && v >= 0, what = "an integer >= 0";
          break;
        case Takes::kPositiveInt:
          ok = integer && v >= 1, what = "an integer >= 1";
          break;
        case Takes::kThreads:
          ok = integer && v >= 0 && v <= 1024, what = "0 (all cores) or a thread count up to 1024";
          break;
        case Takes::kThreshold:
          ok = number && (v >= 0 || v == -1), what = "a finite number >= 0 (or -1: no gate)";
          break;
        case Takes::kDistTimeout:
          ok = number && v > 0 && v <= asap::kMaxDistTimeoutS,
          what = "a number of seconds > 0 and at most 604800 (one week)";
          break;
      }
      ASAP_CHECK(ok, flag, " takes ", what, ", found '", text, "'");
    }
  }
}

void add_dist_options(CLI::App* c, asap::DistOptions& o) {
  c->add_option("--dist-init", o.init,
                "join a process group: tcp://HOST:PORT (with --rank and --world-size) or env:// (torchrun's "
                "variables; also read without this flag)");
  c->add_option("--rank", o.rank, "this process's rank, 0..WORLD_SIZE-1 (with --dist-init tcp://...)");
  c->add_option("--world-size", o.world_size, "number of processes (with --dist-init tcp://...)");
  c->add_option("--dist-timeout", o.timeout_s,
                "seconds within which a rank that stops or hangs ends every rank (at most 604800, one week)")
      ->capture_default_str();
}

std::shared_ptr<asap::Communicator> join_group(const asap::DistOptions& o) {
  return asap::join_process_group(asap::resolve_dist_env(o), o.timeout_s);
}

void set_rank_threads(int threads, asap::Communicator* comm) {
  if (threads <= 0 && comm) {
    if (const char* omp = std::getenv("OMP_NUM_THREADS"); omp && std::atoi(omp) > 0) {
      threads = std::atoi(omp);
    } else {
      char host[256] = {0};
      gethostname(host, sizeof host - 1);
      int here = 0;
      for (const auto& h : comm->allgather(host)) here += h == host;
      const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      threads = std::max(1, cores / std::max(1, here));
    }
  }
  set_threads(threads);
}

std::vector<std::string> expand_files(const std::vector<std::string>& args, const char* flag) {
  std::vector<std::string> out;
  for (const auto& a : args) {
    if (a.find_first_of("*?[") == std::string::npos) {
      out.push_back(a);
      continue;
    }
    glob_t g{};
    const int rc = ::glob(a.c_str(), 0, nullptr, &g);
    std::vector<std::string> hits;
    if (rc == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) hits.push_back(g.gl_pathv[i]);
    globfree(&g);
    ASAP_CHECK(!hits.empty(), flag, " pattern '", a, "' matches no file");
    std::sort(hits.begin(), hits.end());
    out.insert(out.end(), hits.begin(), hits.end());
  }
  return out;
}

void GroupProgress::operator()(const asap::ProgressEvent& e) {
  const std::string label = e.layer + " " + e.phase;
  const bool summed = e.phase == "statistics" || e.phase == "selection" || e.phase == "verify";
  if (!comm_ || !summed) {
    if (!comm_ || comm_->rank() == 0) bar_.update(label, e.done, e.total);
    return;
  }
  const std::string key = stage_ + "/" + e.layer + "/" + e.phase;
  long long& last = last_[key];
  const long long delta = std::max(0LL, static_cast<long long>(e.done) - last);
  last = std::max(last, static_cast<long long>(e.done));
  const long long total = comm_->add_counter(key, delta);
  if (comm_->rank() == 0) bar_.update(label + " (all ranks)", total, e.total);
}

}  // namespace asapc
