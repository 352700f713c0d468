#pragma once
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "asap/compile.h"

namespace asapc {

// Compile's fidelity report: verify's metrics and latencies on the held-out
// split of the calibration file, written as JSON and HTML beside the
// artifact; prints one line per layer. Returns the report JSON.
nlohmann::json write_compile_report(const asap::Artifact& art, const std::string& artifact_path,
                                    const std::string& checkpoint, const std::vector<std::string>& calib,
                                    const asap::CompileOptions& opt, const std::string& html_path,
                                    const std::string& json_path, std::ostream& os,
                                    const std::function<void(const asap::ProgressEvent&)>& progress);

// The per-layer summary lines: default operator, ASAP-0, the reduced-budget
// Sinkhorn of nearest latency, and the speedup over the teacher.
void print_report_lines(const nlohmann::json& report, std::ostream& os);

}  // namespace asapc
