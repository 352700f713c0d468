// The run-time code depends in one direction (docs/performance.md,
// "Layering"): the runtime (src/lib/runtime/, asap/runtime.h) chooses
// between the fused kernels (src/lib/fast/, fast/fast.h) and the ATen
// reference (src/lib/reference/, asap/teacher.h, asap/operator.h,
// asap/features.h); neither of those two includes the runtime or the other,
// or calls the other's entry points. Read from the source tree.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
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
  const auto files = layer_files("fast", {});
  REQUIRE(files.size() > 10);
  const std::regex includes(R"(#include\s+"(asap/runtime\.h|asap/operator\.h|asap/features\.h|runtime/|reference/))");
  const std::regex calls(
      R"(\b(run_teacher_reference|run_layer_reference|run_teacher|run_layer|log_marginals|run_closures|asap::build_features)\s*\()");
  for (const auto& hit : offending(files, includes)) FAIL_CHECK("fast/ includes above or beside itself: " << hit);
  for (const auto& hit : offending(files, calls)) FAIL_CHECK("fast/ calls a reference or runtime entry point: " << hit);
}

TEST_CASE("layering: the reference path knows neither the runtime nor the kernels") {
  const auto files = layer_files("reference", {"teacher.h", "operator.h", "features.h", "layer_call.h"});
  REQUIRE(files.size() > 5);
  const std::regex includes(R"(#include\s+"(asap/runtime\.h|asap/fast\.h|runtime/|fast/))");
  const std::regex calls(R"(\bfast::\w+\s*\(|\b(run_teacher|run_layer)\s*\()");
  for (const auto& hit : offending(files, includes)) FAIL_CHECK("reference/ includes above or beside itself: " << hit);
  for (const auto& hit : offending(files, calls))
    FAIL_CHECK("reference/ calls a runtime or kernel entry point: " << hit);
}

// Every folder of src/lib has a layer (docs/architecture.md, "Folders and
// what they may include"); each public header belongs to the folder that
// implements it. A file may include headers of its own folder and of lower
// layers only: never a higher layer, and never a sibling folder of the same
// layer, so no two folders include each other.
namespace {

const std::map<std::string, int>& folder_layers() {
  static const std::map<std::string, int> m = {
      {"util", 0}, {"checkpoint", 1}, {"report", 1},      {"model", 2},   {"fast", 3},   {"reference", 3},
      {"io", 3},   {"runtime", 4},    {"distributed", 4}, {"compile", 5}, {"verify", 6},
  };
  return m;
}

const std::map<std::string, std::string>& header_owners() {
  static const std::map<std::string, std::string> m = {
      {"error.h", "util"},         {"checkpoint.h", "checkpoint"}, {"report.h", "report"},
      {"spec.h", "model"},         {"layer.h", "model"},           {"layer_call.h", "model"},
      {"types.h", "model"},        {"teacher.h", "reference"},     {"operator.h", "reference"},
      {"features.h", "reference"}, {"metrics.h", "reference"},     {"artifact.h", "io"},
      {"calib.h", "io"},           {"runtime.h", "runtime"},       {"dist.h", "distributed"},
      {"compile.h", "compile"},    {"verify.h", "verify"},         {"compile_record.h", "report"},
  };
  return m;
}

// Layering violations of one file of folder `folder`.
std::vector<std::string> upward_includes(const fs::path& file, const std::string& folder) {
  std::vector<std::string> out;
  const int mine = folder_layers().at(folder);
  const std::regex inc(R"(^\s*#include\s+"([a-z_]+)/([a-z_0-9]+\.h)\")");
  std::istringstream in(read_text(file));
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, inc)) continue;
    std::string owner;
    if (m[1] == "asap") {
      auto it = header_owners().find(m[2]);
      if (it == header_owners().end()) {
        out.push_back(file.filename().string() + ": includes asap/" + m[2].str() + ", which has no layer");
        continue;
      }
      owner = it->second;
    } else {
      owner = m[1];
      if (!folder_layers().count(owner)) continue;  // not a src/lib folder
    }
    if (owner == folder) continue;
    const int theirs = folder_layers().at(owner);
    if (theirs >= mine)
      out.push_back(folder + "/" + file.filename().string() + " (layer " + std::to_string(mine) + ") includes " +
                    m[1].str() + "/" + m[2].str() + " of " + owner + "/ (layer " + std::to_string(theirs) + ")");
  }
  return out;
}

}  // namespace

TEST_CASE("layering: no folder of src/lib includes a higher layer or a sibling") {
  const fs::path root(ASAP_SOURCE_DIR);
  std::set<std::string> seen;
  for (const auto& e : fs::directory_iterator(root / "src/lib")) {
    if (!e.is_directory()) continue;
    const std::string folder = e.path().filename().string();
    seen.insert(folder);
    REQUIRE_MESSAGE(folder_layers().count(folder),
                    "src/lib/" << folder << " has no layer: add it here and to docs/architecture.md");
    for (const auto& f : fs::directory_iterator(e.path()))
      for (const auto& hit : upward_includes(f.path(), folder)) FAIL_CHECK(hit);
  }
  CHECK(seen.size() == folder_layers().size());
  // The public headers, each as part of its folder.
  for (const auto& e : fs::directory_iterator(root / "include/asap")) {
    const std::string h = e.path().filename().string();
    REQUIRE_MESSAGE(header_owners().count(h), "include/asap/" << h << " has no owning folder: add it here");
    for (const auto& hit : upward_includes(e.path(), header_owners().at(h))) FAIL_CHECK(hit);
  }
}

TEST_CASE("layering: the check finds an upward and a sibling include") {
  // The rule itself, on files written for the purpose.
  const fs::path dir = fs::temp_directory_path() / "asap_layering_probe";
  fs::create_directories(dir);
  const fs::path up = dir / "up.cpp", side = dir / "side.cpp", down = dir / "down.cpp";
  std::ofstream(up) << "#include \"asap/compile.h\"\n";
  std::ofstream(side) << "#include \"asap/teacher.h\"\n#include \"fast/engine.h\"\n";
  std::ofstream(down) << "#include \"asap/types.h\"\n#include \"util/timing.h\"\n#include <vector>\n";
  CHECK(upward_includes(up, "io").size() == 1);
  CHECK(upward_includes(side, "fast").size() == 1);  // math is fast's sibling
  CHECK(upward_includes(side, "io").size() == 2);
  CHECK(upward_includes(down, "fast").empty());
  fs::remove_all(dir);
}
