// asap/report.h -- the fidelity report: a self-contained HTML page (inline
// SVG, no network) and its JSON, from a verify result.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace asap {

// Renders the report page for verify's JSON (VerifyResult::to_json()).
// `title` heads the page; `note` (may be empty) is shown under it, e.g. to
// say the data are compile's held-out split.
std::string render_html_report(const nlohmann::json& verify_json, const std::string& title, const std::string& note);

// Writes PATH.json and PATH.html atomically (either may be empty to skip).
void write_report(const nlohmann::json& verify_json, const std::string& html_path, const std::string& json_path,
                  const std::string& title, const std::string& note);

}  // namespace asap
