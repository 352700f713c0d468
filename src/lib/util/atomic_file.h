// Writing outputs so nothing is lost: write PATH.tmp-XXXXXX beside the
// target, then rename over it. An interrupted run leaves the old file (or
// none), never a partial one.
#pragma once
#include <functional>
#include <string>

namespace asap {

// A temporary path in the same directory as `path` (same filesystem, so the
// final rename is atomic).
std::string temp_path_for(const std::string& path);

// Calls write(tmp) then renames tmp to path; removes tmp if write throws.
void write_atomically(const std::string& path, const std::function<void(const std::string&)>& write);

// Test hook of both atomic writers (this one and the HDF5 one): with
// ASAP_TEST_KILL_BEFORE_RENAME=1 in the environment the process kills
// itself (SIGKILL) after the temporary file is complete and before the
// rename, the worst moment for a real kill. Never set outside the tests.
void test_kill_before_rename();

// Convenience for text outputs.
void write_file_atomically(const std::string& path, const std::string& contents);

}  // namespace asap
