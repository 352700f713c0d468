#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "asap/compile.h"
#include "asap/verify.h"

namespace asapc {

// Compile's fidelity report: verify's metrics and latencies on the held-out
// split of the calibration file, written as JSON and HTML beside the
// artifact. Returns what it measured: verify's result, or why there was too
// little held-out data to (the JSON file is written from it).
struct CompileReport {
  std::optional<asap::VerifyResult> verify;  // unset: the held-out split is too small
  std::string message;                       // then: why
};
CompileReport write_compile_report(const asap::Artifact& art, const asap::CompileSummary& summary,
                                   const std::string& artifact_path, const std::string& checkpoint,
                                   const std::vector<std::string>& calib, const asap::CompileOptions& opt,
                                   const std::string& html_path, const std::string& json_path, std::ostream& os,
                                   const std::function<void(const asap::ProgressEvent&)>& progress);

// The per-layer summary lines: default operator, ASAP-0, the reduced-budget
// Sinkhorn of nearest latency, and the speedup over the teacher.
void print_report_lines(const CompileReport& report, std::ostream& os);

}  // namespace asapc
