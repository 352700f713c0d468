// Times a switch of LibTorch's thread count and back, 100 times, each followed
// by an empty at::parallel_for over 64 items: mode 0 with at::set_num_threads
// (which also rebuilds caffe2's pthreadpool), mode 1 with omp_set_num_threads
// (what the tests' Threads helper does). docs/reliability.md, "Test time".
// Built and run by thread_switch.sh.
#include <ATen/Parallel.h>
#include <omp.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
int main(int argc, char** argv) {
  if (argc != 2 || (std::strcmp(argv[1], "0") != 0 && std::strcmp(argv[1], "1") != 0)) {
    std::fprintf(stderr,
                 "thread_switch: expected one argument, 0 (at::set_num_threads) or 1 (omp_set_num_threads), found %s\n",
                 argc > 1 ? argv[1] : "none");
    return 2;
  }
  const int mode = argv[1][0] - '0';
  at::set_num_threads(2);
  auto t0 = std::chrono::steady_clock::now();
  clock_t c0 = clock();
  for (int i = 0; i < 100; ++i) {
    if (mode == 0) {
      at::set_num_threads(1);
      at::set_num_threads(2);
    } else {
      omp_set_num_threads(1);
      omp_set_num_threads(2);
    }
    at::parallel_for(0, 64, 1, [](int64_t, int64_t) {});
  }
  double w = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("mode %d: wall %.3f ms per pair, cpu %.3f ms per pair, get_num_threads %d\n", mode, w * 10,
         double(clock() - c0) / CLOCKS_PER_SEC * 10, at::get_num_threads());
}
