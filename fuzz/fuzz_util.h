// fuzz/fuzz_util.h -- shared by the libFuzzer targets (docs/reliability.md).
//
// The readers under test take a path, so each input is written to a fresh
// temporary file (in $ASAP_FUZZ_TMPDIR, else /dev/shm when it exists, else
// $TMPDIR or /tmp) with a new name for every input, removed after the input
// ran. After each input the HDF5 targets call H5garbage_collect(), and every
// file and object the reader opened has been closed, so no HDF5 cache, free
// list or global heap carries state from one input to the next: a crash then
// depends on its input alone and reproduces in a fresh process (issue 28,
// item 3).
//
// The contract fuzzed: any input either loads or throws asap::Error (one
// sentence for the user). Any other exception -- c10::Error, std::bad_alloc,
// std::logic_error from ASAP_ASSERT, a leaked H5::Exception -- is a finding,
// and so is every sanitizer report, crash, hang and allocation over
// -malloc_limit_mb / -rss_limit_mb.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <typeinfo>

#include "asap/error.h"

namespace asap_fuzz {

inline std::string temp_dir() {
  // tools/run_sanitizers.sh points this at a scratch directory that it
  // removes afterwards: a crashing or timed-out input never reaches ~InputFile.
  const char* d = std::getenv("ASAP_FUZZ_TMPDIR");
  if (d && *d) return d;
  if (access("/dev/shm", W_OK) == 0) return "/dev/shm";
  const char* t = std::getenv("TMPDIR");
  return t && *t ? t : "/tmp";
}

// One input's file: a new path for every input (pid and a per-process
// counter), so neither the path nor the inode of a previous input is reused;
// removed when the input is done.
class InputFile {
 public:
  InputFile(const uint8_t* data, size_t size, const char* suffix) {
    static unsigned long long counter = 0;
    path_ = temp_dir() + "/asap-fuzz-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + suffix;
    FILE* f = std::fopen(path_.c_str(), "wbx");  // x: never an existing file
    if (!f) {
      std::perror(path_.c_str());
      std::abort();
    }
    if (size && std::fwrite(data, 1, size, f) != size) std::abort();
    std::fclose(f);
  }
  ~InputFile() { std::remove(path_.c_str()); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Runs f; asap::Error is the expected refusal, anything else aborts so that
// libFuzzer keeps the input.
template <typename F>
void expect_load_or_refuse(const char* target, F&& f) {
  try {
    f();
    static const bool verbose = std::getenv("ASAP_FUZZ_VERBOSE") != nullptr;
    if (verbose) std::fprintf(stderr, "%s: loaded\n", target);
  } catch (const asap::Error& e) {
    // Refused with a message: fine. ASAP_FUZZ_VERBOSE=1 prints it (to check
    // that the seeds load, or what a regression input is refused with).
    static const bool verbose = std::getenv("ASAP_FUZZ_VERBOSE") != nullptr;
    if (verbose) std::fprintf(stderr, "%s: refused: %s\n", target, e.what());
    return;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: unexpected %s (not asap::Error): %s\n", target, typeid(e).name(), e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "%s: unexpected non-std exception\n", target);
    std::abort();
  }
}

}  // namespace asap_fuzz
