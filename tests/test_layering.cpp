// The run-time code depends in one direction (docs/performance.md,
// "Layering"): the runtime (src/lib/runtime/, asap/runtime.h) chooses
// between the fused kernels (src/lib/fast/, asap/fast.h) and the ATen
// reference (src/lib/math/, asap/teacher.h, asap/operator.h,
// asap/features.h); neither of those two includes the runtime or the other,
// or calls the other's entry points. Read from the source tree.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Files of a directory of src/lib, plus extra headers under include/.
std::vector<fs::path> layer_files(const std::string& dir, const std::vector<std::string>& headers) {
  std::vector<fs::path> out;
  const fs::path root(ASAP_SOURCE_DIR);
  for (const auto& e : fs::directory_iterator(root / "src/lib" / dir))
    if (e.is_regular_file()) out.push_back(e.path());
  for (const auto& h : headers) out.push_back(root / "include/asap" / h);
  return out;
}

// "file: line" for every line of `files` matching `pattern`.
std::vector<std::string> offending(const std::vector<fs::path>& files, const std::regex& pattern) {
  std::vector<std::string> hits;
  for (const auto& f : files) {
    std::istringstream in(read_text(f));
    std::string line;
    while (std::getline(in, line)) {
      const auto code = line.substr(0, line.find("//"));  // comments may name anything
      if (std::regex_search(code, pattern)) hits.push_back(f.filename().string() + ": " + line);
    }
  }
  return hits;
}

}  // namespace

TEST_CASE("layering: the kernels know neither the runtime nor the reference path") {
  const auto files = layer_files("fast", {"fast.h"});
  REQUIRE(files.size() > 10);
  const std::regex includes(R"(#include\s+"(asap/runtime\.h|asap/operator\.h|asap/features\.h|runtime/|math/))");
  const std::regex calls(
      R"(\b(run_teacher_reference|run_layer_reference|run_teacher|run_layer|log_marginals|run_closures|asap::build_features)\s*\()");
  for (const auto& hit : offending(files, includes)) FAIL_CHECK("fast/ includes above or beside itself: " << hit);
  for (const auto& hit : offending(files, calls)) FAIL_CHECK("fast/ calls a reference or runtime entry point: " << hit);
}

TEST_CASE("layering: the reference path knows neither the runtime nor the kernels") {
  const auto files = layer_files("math", {"teacher.h", "operator.h", "features.h", "layer_call.h"});
  REQUIRE(files.size() > 5);
  const std::regex includes(R"(#include\s+"(asap/runtime\.h|asap/fast\.h|runtime/|fast/))");
  const std::regex calls(R"(\bfast::\w+\s*\(|\b(run_teacher|run_layer)\s*\()");
  for (const auto& hit : offending(files, includes)) FAIL_CHECK("math/ includes above or beside itself: " << hit);
  for (const auto& hit : offending(files, calls)) FAIL_CHECK("math/ calls a runtime or kernel entry point: " << hit);
}
