#include "util/atomic_file.h"

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>

#include "asap/error.h"

namespace asap {

void test_kill_before_rename() {
  if (const char* k = std::getenv("ASAP_TEST_KILL_BEFORE_RENAME"); k && *k == '1') std::raise(SIGKILL);
}

std::string temp_path_for(const std::string& path) {
  static thread_local std::mt19937_64 gen{std::random_device{}()};
  const char* hex = "0123456789abcdef";
  std::string suffix;
  for (int i = 0; i < 8; ++i) suffix += hex[gen() & 15];
  return path + ".tmp-" + suffix;
}

void write_atomically(const std::string& path, const std::function<void(const std::string&)>& write) {
  const std::string tmp = temp_path_for(path);
  try {
    write(tmp);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  test_kill_before_rename();
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw Error(str("cannot write '", path, "': rename from temporary file failed: ", std::strerror(err)));
  }
}

void write_file_atomically(const std::string& path, const std::string& contents) {
  write_atomically(path, [&](const std::string& tmp) {
    std::ofstream out(tmp, std::ios::binary);
    ASAP_CHECK(out.good(), "cannot write '", path, "': cannot create '", tmp, "'");
    out << contents;
    out.close();
    ASAP_CHECK(out.good(), "cannot write '", path, "': writing '", tmp, "' failed (disk full?)");
  });
}

}  // namespace asap
