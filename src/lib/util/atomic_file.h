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

// Convenience for text outputs.
void write_file_atomically(const std::string& path, const std::string& contents);

}  // namespace asap
