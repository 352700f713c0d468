// Serving throughput benchmark (docs/serving.md): C caller threads each call
// CompiledModel::attend on one layer of a loaded artifact with batch B and
// sequence length n, as a server would, for a fixed time; prints calls/s.
// The intra-op thread count is set on every caller (at::set_num_threads);
// the OpenMP wait policy comes from the environment (OMP_WAIT_POLICY is read
// when libgomp loads). tools/bench/bench_serving.sh sweeps callers x intra-op
// threads x wait policy and prints the table. A benchmark: run it on a quiet
// machine, never as a test.
//
//   asap_bench_serving ARTIFACT [--layer NAME] [--callers C] [--threads I]
//                      [--n N] [--batch B] [--seconds S]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "asap/error.h"
#include "asap/runtime.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s ARTIFACT [--layer NAME] [--callers C] [--threads I] [--n N] [--batch B] "
                 "[--seconds S]\n",
                 argv[0]);
    return 2;
  }
  std::string path = argv[1], layer;
  int callers = 1, threads = 1;
  int64_t n = 17, batch = 1;
  double seconds = 3;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--layer")
      layer = v;
    else if (k == "--callers")
      callers = std::atoi(v.c_str());
    else if (k == "--threads")
      threads = std::atoi(v.c_str());
    else if (k == "--n")
      n = std::atoll(v.c_str());
    else if (k == "--batch")
      batch = std::atoll(v.c_str());
    else if (k == "--seconds")
      seconds = std::atof(v.c_str());
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  try {
    auto model = asap::CompiledModel::load(path);
    if (layer.empty()) layer = model->layer_names().at(0);
    const auto& L = model->layer(layer).spec;
    at::manual_seed(0);
    const at::Tensor q = at::randn({batch, L.heads, n, L.head_dim});
    const at::Tensor k = at::randn({batch, L.heads, n, L.head_dim});
    const at::Tensor v = at::randn({batch, L.heads, n, L.value_dim});
    std::atomic<bool> go{false}, stop{false};
    std::vector<long long> calls(static_cast<size_t>(callers), 0);
    std::vector<std::thread> pool;
    for (int c = 0; c < callers; ++c)
      pool.emplace_back([&, c] {
        at::set_num_threads(threads);
        (void)model->attend(layer, q, k, v);  // warm-up: engines and scratch
        while (!go.load()) std::this_thread::yield();
        long long m = 0;
        while (!stop.load(std::memory_order_relaxed)) {
          (void)model->attend(layer, q, k, v);
          ++m;
        }
        calls[static_cast<size_t>(c)] = m;
      });
    const auto t0 = std::chrono::steady_clock::now();
    go = true;
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    stop = true;
    for (auto& t : pool) t.join();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    long long total = 0;
    for (long long m : calls) total += m;
    const char* wait = std::getenv("OMP_WAIT_POLICY");
    std::printf(
        "{\"layer\": \"%s\", \"n\": %lld, \"batch\": %lld, \"callers\": %d, \"threads\": %d, "
        "\"wait_policy\": \"%s\", \"seconds\": %.3f, \"calls\": %lld, \"calls_per_s\": %.0f}\n",
        layer.c_str(), static_cast<long long>(n), static_cast<long long>(batch), callers, threads,
        wait ? wait : "default", dt, total, total / dt);
  } catch (const asap::Error& e) {
    std::fprintf(stderr, "asap_bench_serving: %s\n", e.what());
    return 2;
  }
  return 0;
}
