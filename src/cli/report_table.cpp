#include "report_table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "common.h"

namespace asapc {

namespace {

std::string num(double v, const char* fmt = "%.4f") {
  if (v < 0) return "-";
  char b[32];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}

// The plan KL: infinite when the operator underflows to 0 where the teacher
// has mass (JSON keeps that as null); then the floored value, marked.
std::string kl_text(const nlohmann::json& m, const char* fmt, bool& floored) {
  const auto& kl = m["teacher_plan_kl"];
  if (kl.is_number() && std::isfinite(kl.get<double>())) return num(kl.get<double>(), fmt);
  floored = true;
  return num(m.value("teacher_plan_kl_floored", -1.0), fmt) + "+";
}

std::string ms(double s) { return s < 0 ? "-" : num(s * 1e3, "%.3f") + " ms"; }

std::string op_label(const nlohmann::json& o, int T) {
  const std::string kind = o["kind"];
  const int steps = o["steps"];
  const std::string star = o["default"].get<bool>() ? " *" : "";
  if (kind == "teacher") return "teacher T=" + std::to_string(steps) + star;
  if (kind == "asap") return "ASAP k=" + std::to_string(steps) + (o["default"].get<bool>() ? " *" : "");
  return "Sinkhorn T'=" + std::to_string(steps) + (o["teacher_ending"].get<bool>() ? "" : " (other end)") + star;
  (void)T;
}

}  // namespace

void print_verify_table(const nlohmann::json& v, std::ostream& os) {
  char line[512];
  for (const auto& l : v["layers"]) {
    const int T = l["T"];
    os << "\nlayer '" << l["name"].get<std::string>() << "': teacher T=" << T << " (" << l["ending"].get<std::string>()
       << "-ending), " << l["examples"].get<int64_t>() << " examples";
    if (l["fit_time_s"].get<double>() >= 0) os << ", fit " << human_seconds(l["fit_time_s"].get<double>());
    if (l["break_even_calls"].get<double>() >= 0)
      os << ", pays off after " << num(l["break_even_calls"].get<double>(), "%.0f") << " calls";
    os << "\n";
    std::snprintf(line, sizeof line, "  %-24s %6s %10s %10s %9s %9s %10s %12s %8s\n", "operator", "passes", "attn err",
                  "out RMSE", "row marg", "col marg", "plan KL", "latency", "speedup");
    os << line;
    double t_teacher = -1;
    bool floored = false;
    double zero_share = 0;
    for (const auto& o : l["operators"])
      if (o["kind"] == "teacher") t_teacher = o["latency_s"];
    for (const auto& o : l["operators"]) {
      const auto& m = o["metrics"];
      const double lat = o["latency_s"];
      std::string speed = (lat > 0 && t_teacher > 0) ? num(t_teacher / lat, "%.2f") + "x" : "-";
      std::snprintf(line, sizeof line, "  %-24s %6d %10s %10s %9s %9s %10s %12s %8s\n", op_label(o, T).c_str(),
                    o["lse_passes"].get<int>(), num(m["attention_rel_error"]).c_str(),
                    num(m["head_output_rmse"]).c_str(), num(m["row_marginal_error"]).c_str(),
                    num(m["col_marginal_error"]).c_str(), kl_text(m, "%.2e", floored).c_str(), ms(lat).c_str(),
                    speed.c_str());
      os << line;
      zero_share = std::max(zero_share, m.value("plan_zero_share", 0.0));
    }
    os << "  * default operator; passes count log-sum-exp sweeps (closures plus feature passes)\n";
    if (floored)
      os << "  + plan KL is infinite: the operator gives exactly 0 to up to " << num(100 * zero_share, "%.3f")
         << "% of the entries the teacher weights; shown with its attention floored at 1e-12\n";
    // The compiled choice against the paper's plain map (sliced potentials, pooled), from compile's record.
    const auto& fit = l.contains("fit") ? l["fit"] : nlohmann::json();
    if (fit.is_object() && fit.contains("chosen") && fit.contains("candidates")) {
      const auto& c = fit["chosen"];
      const int k = c.value("closures", 0);
      if (c.value("operator", std::string("asap")) != "asap")
        os << "  compiled: " << c.value("description", std::string("?"));
      else
        os << "  compiled: " << c.value("family", std::string("?"))
           << (c.value("per_head", false) ? " per head" : " pooled") << ", k=" << k;
      os << " (held-out error at compile " << num(c.value("heldout_attention_error", -1.0)) << ")";
      for (const auto& cand : fit["candidates"])
        if (cand.value("candidate", std::string()) == "slices/pooled") {
          const auto& errs = cand["heldout_attention_error_by_k"];
          if (k >= 1 && static_cast<size_t>(k) <= errs.size())
            os << "; paper's map (slices, pooled) at k=" << k << ": " << num(errs[k - 1].get<double>());
        }
      os << "\n";
      if (fit.contains("decision") && !fit["decision"].get<std::string>().empty())
        os << "  compile's choice: " << fit["decision"].get<std::string>() << "\n";
    }
  }
  if (v.contains("compare")) {
    os << "\nside by side (default operators):\n";
    std::vector<nlohmann::json> all{v};
    bool cmp_floored = false;
    for (const auto& c : v["compare"]) all.push_back(c);
    for (const auto& a : all)
      for (const auto& l : a["layers"])
        for (const auto& o : l["operators"])
          if (o["default"].get<bool>()) {
            std::snprintf(line, sizeof line, "  %-34s %-28s fit %-3s k=%d attn err %s  plan KL %s\n",
                          a["artifact"].get<std::string>().c_str(), l["name"].get<std::string>().c_str(),
                          a.value("fit", "ls").c_str(), o["steps"].get<int>(),
                          num(o["metrics"]["attention_rel_error"]).c_str(),
                          kl_text(o["metrics"], "%.3e", cmp_floored).c_str());
            os << line;
          }
  }
}

}  // namespace asapc
