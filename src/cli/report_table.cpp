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
// has mass (verify's JSON keeps that as null); then the floored value, marked.
std::string kl_text(const asap::FidelityMetrics& m, const char* fmt, bool& floored) {
  if (std::isfinite(m.teacher_plan_kl)) return num(m.teacher_plan_kl, fmt);
  floored = true;
  return num(m.teacher_plan_kl_floored, fmt) + "+";
}

std::string ms(double s) { return s < 0 ? "-" : num(s * 1e3, "%.3f") + " ms"; }

std::string op_label(const asap::OperatorResult& o) {
  const std::string star = o.is_default ? " *" : "";
  if (o.kind == "teacher") return "teacher T=" + std::to_string(o.steps) + star;
  if (o.kind == "asap") return "ASAP k=" + std::to_string(o.steps) + star;
  return "Sinkhorn T'=" + std::to_string(o.steps) + (o.teacher_ending ? "" : " (other end)") + star;
}

// The compiled choice against the paper's plain map (sliced potentials,
// pooled), from compile's record.
void print_compiled(const asap::LayerRecord& fit, std::ostream& os) {
  const asap::ChosenRecord& c = fit.chosen;
  const int k = c.closures.value_or(0);
  if (!c.is_asap())
    os << "  compiled: " << c.description;
  else
    os << "  compiled: " << *c.family << (*c.per_head ? " per head" : " pooled") << ", k=" << k;
  os << " (held-out error at compile " << num(c.heldout_attention_error);
  // The stored coefficients' own error when a refit replaced the LS ones.
  if (fit.refit && fit.refit->heldout_attention_error_refit && !fit.refit->fell_back_to_ls.value_or(false))
    os << ", " << num(*fit.refit->heldout_attention_error_refit) << " after the "
       << (fit.refit->fit == "kl" ? "KL fit" : "attention refit");
  os << ")";
  // The paper's map: sliced potentials only, pooled, closure-ready target
  // (compile keeps one slice prefix of it, named "slices/pooled@L<n>").
  for (const auto& cand : fit.candidates)
    if (cand.features == "slices" && !cand.per_head && cand.target == "closure-ready") {
      const auto& errs = cand.heldout_attention_error_by_k;
      if (k >= 1 && static_cast<size_t>(k) <= errs.size())
        os << "; paper's map (slices, pooled) at k=" << k << ": " << num(errs[k - 1]);
    }
  os << "\n";
  if (!fit.decision.empty()) os << "  compile's choice: " << fit.decision << "\n";
}

// The model's line: summed latencies, and the layer furthest from its teacher.
void print_model(const asap::VerifyResult& v, std::ostream& os) {
  const asap::ModelVerification m = v.model();
  os << "\nmodel (" << v.layers.size() << " layer(s)): ";
  if (m.speedup > 0)
    os << num(m.speedup, "%.2f") << "x the teachers' speed (sum of layer latencies " << ms(m.latency_s) << " against "
       << ms(m.teacher_latency_s) << ")";
  else
    os << "not timed";
  for (const auto& l : v.layers)  // what compile measured for the model, from its record
    if (l.record && l.record->model) {
      const auto& r = *l.record->model;
      os << "; at compile " << num(r.speedup, "%.2f") << "x"
         << (r.scope == "model" ? " under one budget for the model" : " with each layer on its own");
      break;
    }
  if (!m.worst_layer.empty())
    os << "; largest error: layer '" << m.worst_layer << "' (" << num(m.worst_error) << ", "
       << num(m.worst_normalized, "%.3f") << " of softmax's)";
  os << "\n";
}

}  // namespace

void print_verify_table(const std::vector<VerifiedArtifact>& all, std::ostream& os) {
  char line[512];
  const asap::VerifyResult& v = all.at(0).result;
  for (const asap::LayerVerification& l : v.layers) {
    os << "\nlayer '" << l.name << "': teacher T=" << l.T << " (" << (l.T % 2 == 0 ? "column" : "row") << "-ending), "
       << l.examples << " examples";
    if (l.fit_time_s >= 0) os << ", fit " << human_seconds(l.fit_time_s);
    if (l.break_even_calls >= 0) os << ", pays off after " << num(l.break_even_calls, "%.0f") << " calls";
    os << "\n";
    std::snprintf(line, sizeof line, "  %-24s %6s %10s %10s %9s %9s %10s %12s %8s\n", "operator", "passes", "attn err",
                  "out RMSE", "row marg", "col marg", "plan KL", "latency", "speedup");
    os << line;
    double t_teacher = -1;
    bool floored = false;
    double zero_share = 0;
    for (const auto& o : l.operators)
      if (o.kind == "teacher") t_teacher = o.latency_s;
    for (const auto& o : l.operators) {
      const auto& m = o.metrics;
      const double lat = o.latency_s;
      std::string speed = (lat > 0 && t_teacher > 0) ? num(t_teacher / lat, "%.2f") + "x" : "-";
      std::snprintf(line, sizeof line, "  %-24s %6d %10s %10s %9s %9s %10s %12s %8s\n", op_label(o).c_str(),
                    o.lse_passes, num(m.attention_rel_error).c_str(), num(m.head_output_rmse).c_str(),
                    num(m.row_marginal_error).c_str(), num(m.col_marginal_error).c_str(),
                    kl_text(m, "%.2e", floored).c_str(), ms(lat).c_str(), speed.c_str());
      os << line;
      zero_share = std::max(zero_share, m.plan_zero_share);
    }
    os << "  * default operator; passes count log-sum-exp sweeps (closures plus feature passes)\n";
    if (floored)
      os << "  + plan KL is infinite: the operator gives exactly 0 to up to " << num(100 * zero_share, "%.3f")
         << "% of the entries the teacher weights; shown with its attention floored at 1e-12\n";
    if (l.record) print_compiled(*l.record, os);
  }
  print_model(v, os);
  if (all.size() > 1) {
    os << "\nside by side (default operators):\n";
    bool cmp_floored = false;
    for (const auto& a : all)
      for (const auto& l : a.result.layers)
        for (const auto& o : l.operators)
          if (o.is_default) {
            std::snprintf(line, sizeof line, "  %-34s %-28s fit %-3s k=%d attn err %s  plan KL %s\n",
                          a.result.artifact.c_str(), l.name.c_str(), a.fit.c_str(), o.steps,
                          num(o.metrics.attention_rel_error).c_str(), kl_text(o.metrics, "%.3e", cmp_floored).c_str());
            os << line;
          }
  }
}

}  // namespace asapc
