// asap_bench_compile -- compile throughput against running only the teacher
// over the same calibration set, in one process, on the same threads
// (issue 9; docs/performance.md).
//
//   asap_bench_compile CKPT SPEC CALIB [--reps 3] [--threads N] [--batch-size 16]
//                      [--max-examples N] [--json out.json]
//
// Three jobs, timed `reps` times each in round-robin order (teacher, compile,
// compile-fixed, teacher, ...) so that drift in machine load hits them alike;
// medians are reported, with ratios to the teacher pass:
//   teacher        open checkpoint, spec and calibration file; per layer
//                  stream every example (read, project) and run the
//                  teacher's finite loop (duals, no attention matrix) --
//                  the least any compile must do;
//   compile        asap::compile_teacher with default options (LS fit,
//                  feature/closure selection on the held-out split), no
//                  fidelity report;
//   compile-fixed  the same with the operator fixed in advance (the
//                  default family per head, 64 slices, k = 1, fixed ridge):
//                  statistics and the LS solve only.
// Threads: OMP/BLAS settings as asap_bench (re-executes itself once with
// OMP_WAIT_POLICY=PASSIVE, OPENBLAS_NUM_THREADS=1 unless set).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "asap/calib.h"
#include "asap/checkpoint.h"
#include "asap/compile.h"
#include "asap/error.h"
#include "asap/runtime.h"
#include "asap/spec.h"
#include "asap/teacher.h"
#include "io/layer_stream.h"

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// The teacher pass: what compile's first pass does minus features and statistics.
double teacher_pass(const std::string& ckpt, const std::string& spec_path, const std::string& calib_path, int64_t batch,
                    int64_t max_examples, int64_t* examples) {
  const auto t0 = Clock::now();
  asap::Checkpoint ck = asap::load_checkpoint(ckpt);
  asap::TeacherSpec spec = asap::read_spec(spec_path);
  asap::validate_spec(spec, ck, spec_path);
  asap::CalibFile calib(calib_path);
  double sink = 0;
  *examples = 0;
  for (const auto& s : spec.layers) {
    asap::LayerStream stream(calib, s, ck, false, max_examples);
    const int64_t N = stream.num_examples();
    *examples += N;
    for (int64_t start = 0; start < N; start += batch) {
      auto b = stream.read(start, std::min(batch, N - start));
      auto t = asap::run_teacher(b.q, b.k, at::Tensor(), b.mask, s.score_scale, s.T, asap::convention_of(s), false);
      sink += t.phi_bar_star.numel();
    }
  }
  if (sink < 0) std::cerr << sink;
  return seconds_since(t0);
}

void pin_runtime(char** argv) {
  if (std::getenv("ASAP_BENCH_PINNED")) return;
  setenv("ASAP_BENCH_PINNED", "1", 1);
  if (!std::getenv("OMP_WAIT_POLICY")) setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  if (!std::getenv("OPENBLAS_NUM_THREADS")) setenv("OPENBLAS_NUM_THREADS", "1", 1);
  execv("/proc/self/exe", argv);  // returns only on failure: carry on as is
}

}  // namespace

int main(int argc, char** argv) try {
  pin_runtime(argv);
  std::vector<std::string> pos;
  int reps = 3, threads = 0;
  int64_t batch = 16, max_examples = 0;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      ASAP_CHECK(i + 1 < argc, "option ", a, " needs a value");
      return argv[++i];
    };
    if (a == "--reps")
      reps = std::stoi(next());
    else if (a == "--threads")
      threads = std::stoi(next());
    else if (a == "--batch-size")
      batch = std::stoll(next());
    else if (a == "--max-examples")
      max_examples = std::stoll(next());
    else if (a == "--json")
      json_path = next();
    else if (a == "-h" || a == "--help") {
      std::cout << "usage: asap_bench_compile CKPT SPEC CALIB [--reps 3] [--threads N] [--batch-size 16] "
                   "[--max-examples N] [--json out.json]\n";
      return 0;
    } else if (!a.empty() && a[0] == '-') {
      throw asap::Error("unknown option '" + a + "'");
    } else {
      pos.push_back(a);
    }
  }
  ASAP_CHECK(pos.size() == 3, "expected CKPT SPEC CALIB, found ", pos.size(), " positional arguments");
  ASAP_CHECK(reps >= 1, "--reps must be at least 1, found ", reps);
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(threads);

  asap::CompileOptions dflt;
  dflt.batch_size = batch;
  dflt.max_examples = max_examples;
  asap::CompileOptions fixed = dflt;
  fixed.candidates = {{"slices+alpha+softmax+sinkhorn3", true}};
  fixed.fixed_slices = 64;
  fixed.closures = 1;
  fixed.ridge = 1e-6;

  int64_t examples = 0;
  json compile_summary;  // of the default compile's last run
  auto run_compile = [&](const asap::CompileOptions& o, bool keep) {
    const auto t0 = Clock::now();
    auto r = asap::compile_teacher(pos[0], pos[1], pos[2], o);
    const double dt = seconds_since(t0);
    if (keep) compile_summary = r.summary;
    return dt;
  };
  std::vector<std::pair<std::string, std::function<double()>>> jobs{
      {"teacher", [&] { return teacher_pass(pos[0], pos[1], pos[2], batch, max_examples, &examples); }},
      {"compile", [&] { return run_compile(dflt, true); }},
      {"compile-fixed", [&] { return run_compile(fixed, false); }},
  };
  for (auto& j : jobs) j.second();  // warm-up: page cache, thread pools
  std::vector<std::vector<double>> t(jobs.size());
  for (int r = 0; r < reps; ++r)
    for (size_t i = 0; i < jobs.size(); ++i) {
      t[i].push_back(jobs[i].second());
      std::cerr << "rep " << r + 1 << "/" << reps << " " << jobs[i].first << ": " << t[i].back() << " s\n";
    }
  const double base = median(t[0]);
  json out{{"checkpoint", pos[0]}, {"spec", pos[1]}, {"calibration", pos[2]}, {"examples_over_layers", examples},
           {"threads", threads},   {"reps", reps},   {"batch_size", batch},   {"jobs", json::array()}};
  std::cout << "job            median s   ratio to teacher\n";
  for (size_t i = 0; i < jobs.size(); ++i) {
    const double m = median(t[i]);
    out["jobs"].push_back({{"job", jobs[i].first}, {"median_s", m}, {"times_s", t[i]}, {"ratio", m / base}});
    std::printf("%-14s %9.3f   %6.2fx\n", jobs[i].first.c_str(), m, m / base);
  }
  json phases = json::array();
  for (const auto& l : compile_summary["layers"]) phases.push_back(l.value("phase_times_s", json::object()));
  out["last_compile_phase_times_s"] = phases;  // default compile, last repeat
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << out.dump(2) << "\n";
    ASAP_CHECK(f.good(), "cannot write '", json_path, "'");
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "asap_bench_compile: " << e.what() << "\n";
  return 1;
}
