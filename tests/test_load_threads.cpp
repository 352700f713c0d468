// Loading from many threads (issue 28, item 5): good and damaged artifacts
// and calibration files loaded from 8 threads at once give, on every thread,
// exactly the result of a load on the main thread -- the same data for good
// files and the same one sentence for damaged ones (the HDF5 error callback
// and the captured HDF5 message are per thread). The ThreadSanitizer run of
// the same loads is tools/tsan_load_threads.sh (docs/reliability.md).
#include <doctest/doctest.h>

#include <atomic>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "asap/artifact.h"
#include "asap/calib.h"
#include "asap/error.h"
#include "asap/runtime.h"
#include "test_util.h"

namespace {

const std::string kSrc = ASAP_SOURCE_DIR;

// "ok <summary>" for a file that loads, else "error <message>".
std::string load(const std::string& path, bool calib) {
  try {
    if (calib) {
      asap::CalibFile cf(path);
      std::string s = "ok";
      for (const auto& n : cf.layer_names()) s += " " + n;
      return s;
    }
    auto m = asap::CompiledModel::load(path);
    std::string s = "ok v" + std::to_string(m->artifact().format_version);
    for (const auto& n : m->layer_names()) s += " " + n;
    return s;
  } catch (const asap::Error& e) {
    return std::string("error ") + e.what();
  }
}

std::string cut_half(const std::string& src, const std::string& dst) {
  std::ifstream in(src, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() > 1000);
  std::ofstream(dst, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  return dst;
}

}  // namespace

TEST_CASE("load threads: 8 threads loading good and damaged files each get the main thread's result") {
  asap_test::TempDir tmp;
  struct Input {
    std::string path;
    bool calib;
    const char* expect;  // a part of the main thread's result, so the inputs are what they claim
  };
  const std::vector<Input> inputs = {
      {kSrc + "/fuzz/corpus/artifact/two_layers.h5", false, "ok v4 blocks.0.attn adapter.attn"},
      {kSrc + "/tests/data/fixtures/vit_calib.h5", true, "ok transformer.layers.0.0.fn"},
      {cut_half(kSrc + "/fuzz/corpus/artifact/two_layers.h5", tmp / "cut.h5"), false,
       "is a damaged or truncated HDF5 file: HDF5 cannot open it (truncated file: eof = "},
      {cut_half(kSrc + "/tests/data/fixtures/vit_calib.h5", tmp / "cut_calib.h5"), true,
       "is a damaged or truncated HDF5 file: HDF5 cannot open it (truncated file: eof = "},
      {kSrc + "/fuzz/hdf5-known/artifact/H5Fopen-leak-damaged-root.h5", false, "is a damaged or truncated HDF5 file"},
      {kSrc + "/fuzz/hdf5-known/artifact/H5HG_protect-hang-vlen-attr.h5", false, "variable-length strings"},
      {kSrc + "/fuzz/hdf5-known/calib/H5HG_read-memcpy-overlap-vlen-attr.h5", true, "variable-length strings"},
      {kSrc + "/fuzz/corpus/artifact/theta_2e40.h5", false, "but only"},
      {kSrc + "/fuzz/corpus/calib/unwritten_chunks.h5", true, "chunks are stored in the file"},
  };
  std::vector<std::string> want;
  for (const auto& in : inputs) {
    want.push_back(load(in.path, in.calib));
    INFO(in.path, " -> ", want.back());
    CHECK(want.back().find(in.expect) != std::string::npos);
    if (want.back().rfind("error ", 0) == 0) CHECK(want.back().find(in.path) != std::string::npos);
  }

  constexpr int kThreads = 8, kRounds = 6;
  std::vector<std::vector<std::string>> got(kThreads);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();  // start together
      for (int r = 0; r < kRounds; ++r)
        for (size_t i = 0; i < inputs.size(); ++i) {
          const size_t j = (i + static_cast<size_t>(t)) % inputs.size();  // threads on different files at once
          got[static_cast<size_t>(t)].push_back(load(inputs[j].path, inputs[j].calib));
        }
    });
  }
  for (auto& th : threads) th.join();
  int mismatches = 0;
  for (int t = 0; t < kThreads; ++t) {
    const auto& g = got[static_cast<size_t>(t)];
    REQUIRE(g.size() == inputs.size() * kRounds);
    for (size_t k = 0; k < g.size(); ++k) {
      const size_t j = (k % inputs.size() + static_cast<size_t>(t)) % inputs.size();
      if (g[k] != want[j]) {
        ++mismatches;
        if (mismatches <= 5) {
          INFO("thread ", t, " file ", inputs[j].path);
          CHECK(g[k] == want[j]);
        }
      }
    }
  }
  CHECK(mismatches == 0);
}
