#pragma once
#include <nlohmann/json.hpp>
#include <ostream>

namespace asapc {
// A concise per-layer table of verify's JSON.
void print_verify_table(const nlohmann::json& v, std::ostream& os);
}  // namespace asapc
