// ThreadSanitizer driver for loading from many threads (issue 28, item 5).
// Built and run by tools/tsan_load_threads.sh with -fsanitize=thread from
// src/lib/io/h5util.cpp and src/lib/util/atomic_file.cpp only (the rest of
// the library is not needed to reach HDF5's error paths, and LibTorch,
// libgomp and HDF5 are not instrumented). Each file is loaded the way the
// readers do -- open, refuse a variable-length root string, read 'format',
// then every group, dataset (shape, stored extent, data) and string dataset --
// first on the main thread, then from 8 threads at once, 6 rounds each; every
// thread must get exactly the main thread's result (data summary or error
// sentence). Exit 0 when all match; TSan's report (exit 66) fails the script.
//
//   load_threads FILE...
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "asap/error.h"
#include "io/h5util.h"

namespace h5 = asap::detail::h5;

namespace {

void walk(const H5::Group& g, const h5::Where& w, std::string& out) {
  for (const std::string& name : h5::list_children(g, false, w)) {
    h5::Where cw = w.child(name);
    if (h5::is_group(g, name)) {
      H5::Group c = h5::guarded(w, "opening a group", [&] { return g.openGroup(name); });
      if (h5::has_attr(c, "name")) out += " name=" + h5::read_string_attr(c, "name", cw);
      walk(c, cw, out);
    } else if (h5::is_dataset(g, name)) {
      H5::DataSet ds = h5::open_dataset(g, name, w);
      h5::DatasetInfo info = h5::dataset_info(ds, cw);
      if (info.cls == H5T_STRING) {
        out += " " + name + "=" + std::to_string(h5::read_string_dataset(g, name, w).size()) + "chars";
      } else if (info.numel <= (int64_t{1} << 22)) {
        at::Tensor t = h5::read_all(ds, at::kDouble, cw);
        out += " " + name + "=" + std::to_string(t.sum().item<double>());
      }
    }
  }
}

std::string load(const std::string& path) {
  try {
    h5::Where w{"file '" + path + "'", "/"};
    H5::H5File f = h5::open_file(path, w);
    const bool artifact = h5::has_attr(f, "format_version");
    h5::refuse_vlen_root(f, w, artifact ? "format_version" : "version", artifact ? 4 : 2, path, "rebuild it");
    std::string out = "ok " + h5::read_string_attr(f, "format", w);
    walk(f, w, out);
    return out;
  } catch (const asap::Error& e) {
    return std::string("error ") + e.what();
  }
}

}  // namespace

int main(int argc, char** argv) {
  at::set_num_threads(1);  // one intra-op thread: libgomp is not instrumented
  std::vector<std::string> files(argv + 1, argv + argc);
  std::vector<std::string> want;
  for (const auto& f : files) {
    want.push_back(load(f));
    std::printf("%s\n  %s\n", f.c_str(), want.back().substr(0, 160).c_str());
  }
  constexpr int kThreads = 8, kRounds = 6;
  std::atomic<int> ready{0}, mismatches{0}, loads{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();
      for (int r = 0; r < kRounds; ++r)
        for (size_t i = 0; i < files.size(); ++i) {
          const size_t j = (i + static_cast<size_t>(t)) % files.size();
          const std::string got = load(files[j]);
          loads.fetch_add(1);
          if (got != want[j] && mismatches.fetch_add(1) < 5)
            std::fprintf(stderr, "thread %d, %s:\n  got  %s\n  want %s\n", t, files[j].c_str(), got.c_str(),
                         want[j].c_str());
        }
    });
  for (auto& th : threads) th.join();
  std::printf("%d loads on %d threads, %d differ from the main thread's\n", loads.load(), kThreads, mismatches.load());
  return mismatches.load() == 0 ? 0 : 1;
}
