// The fidelity report page: one self-contained HTML file (inline CSS and
// SVG, no scripts, no network) rendered from verify's JSON. Every field is
// read defensively: older or partial JSON renders with what it has.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "asap/report.h"
#include "report/svg.h"

namespace asap {

namespace {

using json = nlohmann::json;
using svg::esc;
using svg::fmt;

const char* const kSink = "#d9730d";     // reduced-budget Sinkhorn
const char* const kAsap = "#2563eb";     // ASAP
const char* const kCompare = "#9333ea";  // a compared artifact's ASAP
const char* const kTeacher = "#4b5563";  // the teacher
const char* const kHeldout = "#60a5fa";  // compile's held-out estimate

// ---- defensive JSON access --------------------------------------------------

const json& at(const json& j, const char* key) {
  static const json null_value;
  if (j.is_object()) {
    auto it = j.find(key);
    if (it != j.end()) return *it;
  }
  return null_value;
}
double num(const json& j, const char* key, double def = -1) {
  const json& v = at(j, key);
  return v.is_number() ? v.get<double>() : def;
}
std::string str(const json& j, const char* key, const std::string& def = "") {
  const json& v = at(j, key);
  return v.is_string() ? v.get<std::string>() : def;
}
bool flag(const json& j, const char* key, bool def = false) {
  const json& v = at(j, key);
  return v.is_boolean() ? v.get<bool>() : v.is_number() ? v.get<double>() != 0 : def;
}
std::vector<double> nums(const json& a) {
  std::vector<double> v;
  if (a.is_array())
    for (const auto& x : a) v.push_back(x.is_number() ? x.get<double>() : std::nan(""));
  return v;
}
const json& arr(const json& j, const char* key) {
  static const json empty = json::array();
  const json& v = at(j, key);
  return v.is_array() ? v : empty;
}

std::string basename(const std::string& p) {
  const auto s = p.find_last_of('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}
std::string itos(int64_t v) { return std::to_string(v); }
std::string ratio(double r) { return fmt(r) + "\xC3\x97"; }  // 2.53×
bool good(double v) { return std::isfinite(v) && v >= 0; }

// ---- the data model ---------------------------------------------------------

struct Op {
  std::string kind;
  int steps = 0, passes = 0;
  bool is_default = false, teacher_ending = true;
  double lat = -1;
  double err = -1, head_rmse = -1, layer_rmse = -1, row = -1, col = -1, kl = -1, dual_rmse = -1;

  bool timed() const { return lat > 0 && std::isfinite(lat); }
  std::string label() const {
    if (kind == "teacher") return "teacher T=" + itos(steps);
    if (kind == "asap") return "ASAP k=" + itos(steps);
    if (kind == "sinkhorn") return "Sinkhorn T\xE2\x80\xB2=" + itos(steps);
    return kind + " " + itos(steps);
  }
};

// The compile record (the layer's "fit") as far as the page shows it. Read
// tolerantly, as the rest of the page: files of older asapc versions lack
// some fields, and a missing field leaves its default (-1, empty, unset).
struct FitCandidate {
  std::string name = "?";
  std::optional<bool> per_head;
  std::optional<double> slices, ridge;
  std::vector<double> errors, passes;  // by k = 1..
};
struct FitView {
  bool has_chosen = false;               // the record names its chosen operator
  std::optional<std::string> candidate;  // the chosen fit
  std::string family;
  std::optional<bool> per_head;
  double slices = -1, ridge = -1, closures = -1, lse_passes = -1, heldout_error = -1, dual_rmse = -1;
  double pass_budget = -1;
  std::string fit;  // "ls", "kl", "attention"
  double train_examples = -1, heldout_examples = 0, teacher_time = -1;
  std::vector<FitCandidate> candidates;
};

struct Layer {
  std::string name, ending;
  int T = 0, default_k = 0;
  int64_t examples = 0;
  std::vector<Op> ops;
  // Indices into ops (not pointers, so a Layer copies and moves safely).
  int teacher_i = -1, def_i = -1;
  std::vector<int> asap_i, sink_i;
  const Op* teacher() const { return teacher_i < 0 ? nullptr : &ops[teacher_i]; }
  const Op* def() const { return def_i < 0 ? nullptr : &ops[def_i]; }
  std::vector<const Op*> asap() const { return pick(asap_i); }
  std::vector<const Op*> sink() const { return pick(sink_i); }
  std::vector<const Op*> pick(const std::vector<int>& idx) const {
    std::vector<const Op*> v;
    for (int i : idx) v.push_back(&ops[i]);
    return v;
  }
  bool timed = false;  // every operator has a latency
  std::vector<double> per_head, dual_pred, dual_teacher;
  double fit_time = -1, break_even = -1;
  FitView fit;

  std::string other_ending() const { return ending == "column" ? "row" : ending == "row" ? "column" : "other"; }
};

std::optional<double> maybe_num(const json& j, const char* key) {
  const json& v = at(j, key);
  return v.is_number() ? std::optional<double>(v.get<double>()) : std::nullopt;
}
std::optional<bool> maybe_flag(const json& j, const char* key) {
  const json& v = at(j, key);
  return v.is_boolean() ? std::optional<bool>(v.get<bool>()) : std::nullopt;
}

FitView read_fit(const json& f) {
  FitView v;
  const json& chosen = at(f, "chosen");
  v.has_chosen = chosen.is_object();
  if (at(chosen, "candidate").is_string()) v.candidate = str(chosen, "candidate");
  v.family = str(chosen, "family");
  v.per_head = maybe_flag(chosen, "per_head");
  v.slices = num(chosen, "slices", -1);
  v.ridge = num(chosen, "ridge", -1);
  v.closures = num(chosen, "closures", -1);
  v.lse_passes = num(chosen, "lse_passes", -1);
  v.heldout_error = num(chosen, "heldout_attention_error", -1);
  v.dual_rmse = num(chosen, "heldout_dual_rmse", -1);
  v.pass_budget = num(f, "pass_budget", -1);
  v.fit = str(f, "fit");
  v.train_examples = num(f, "train_examples", -1);
  v.heldout_examples = num(f, "heldout_examples", 0);
  v.teacher_time = num(f, "teacher_time_s", -1);
  for (const auto& c : arr(f, "candidates")) {
    FitCandidate fc;
    fc.name = str(c, "candidate", "?");
    fc.per_head = maybe_flag(c, "per_head");
    fc.slices = maybe_num(c, "slices");
    fc.ridge = maybe_num(c, "ridge");
    fc.errors = nums(at(c, "heldout_attention_error_by_k"));
    fc.passes = nums(at(c, "lse_passes_by_k"));
    v.candidates.push_back(std::move(fc));
  }
  return v;
}

Layer read_layer(const json& l) {
  Layer L;
  L.name = str(l, "name", "(unnamed layer)");
  L.T = static_cast<int>(num(l, "T", 0));
  L.default_k = static_cast<int>(num(l, "default_closures", 0));
  L.examples = static_cast<int64_t>(num(l, "examples", 0));
  for (const auto& o : arr(l, "operators")) {
    Op op;
    op.kind = str(o, "kind", "?");
    op.steps = static_cast<int>(num(o, "steps", 0));
    op.passes = static_cast<int>(num(o, "lse_passes", op.steps));
    op.is_default = flag(o, "default");
    op.teacher_ending = flag(o, "teacher_ending", true);
    op.lat = num(o, "latency_s", -1);
    const json& m = at(o, "metrics");
    op.err = num(m, "attention_rel_error");
    op.head_rmse = num(m, "head_output_rmse");
    op.layer_rmse = num(m, "layer_output_rmse");
    op.row = num(m, "row_marginal_error");
    op.col = num(m, "col_marginal_error");
    op.kl = num(m, "teacher_plan_kl", num(m, "teacher_plan_kl_floored"));  // infinite KL (null): the floored one
    op.dual_rmse = num(m, "dual_rmse");
    L.ops.push_back(op);
  }
  for (int i = 0; i < static_cast<int>(L.ops.size()); ++i) {
    const Op& op = L.ops[i];
    if (op.kind == "teacher" && L.teacher_i < 0) L.teacher_i = i;
    if (op.kind == "asap") L.asap_i.push_back(i);
    if (op.kind == "sinkhorn") L.sink_i.push_back(i);
    if (op.is_default && L.def_i < 0) L.def_i = i;
  }
  if (L.def_i < 0)
    for (int i : L.asap_i)
      if (L.ops[i].steps == L.default_k) L.def_i = i;
  auto by_steps = [&L](int a, int b) { return L.ops[a].steps < L.ops[b].steps; };
  std::stable_sort(L.asap_i.begin(), L.asap_i.end(), by_steps);
  std::stable_sort(L.sink_i.begin(), L.sink_i.end(), by_steps);
  if (L.T <= 0 && L.teacher()) L.T = L.teacher()->steps;
  L.ending = str(l, "ending", L.T > 0 ? (L.T % 2 == 0 ? "column" : "row") : "");
  L.timed = !L.ops.empty();
  for (const auto& op : L.ops) L.timed = L.timed && op.timed();
  L.per_head = nums(at(l, "per_head_attention_error"));
  L.dual_pred = nums(at(at(l, "dual_scatter"), "predicted"));
  L.dual_teacher = nums(at(at(l, "dual_scatter"), "teacher"));
  L.fit_time = num(l, "fit_time_s", -1);
  L.break_even = num(l, "break_even_calls", -1);
  L.fit = read_fit(at(l, "fit"));
  return L;
}

// Another artifact of the same teacher, for the side-by-side points.
struct Compared {
  std::string label, artifact;
  std::map<std::string, Layer> layers;
};

// ---- the per-layer verdict --------------------------------------------------

struct Verdict {
  int answer = -1;                 // 1: ASAP closer at equal latency (or passes when untimed), 0: not, -1: cannot tell
  std::string sentence;            // HTML
  const Op* at_latency = nullptr;  // best Sinkhorn (the teacher included) no slower than the default ASAP
  const Op* at_passes = nullptr;   // Sinkhorn with the same LSE passes
};

std::string closer(double a, double b) {  // how ASAP's error a compares to b, as HTML
  if (!(a >= 0) || !(b >= 0)) return "";
  if (a == 0 && b == 0) return "as close as";
  if (a <= b) return a == 0 ? "exact, unlike" : "<b>" + ratio(b / a) + " closer</b> than";
  return b == 0 ? "worse than the exact" : "<b>" + ratio(a / b) + " further</b> from the teacher than";
}

Verdict verdict_of(const Layer& L) {
  Verdict v;
  const std::string name = "<b>" + esc(L.name) + "</b>: ";
  if (!L.def() || !good(L.def()->err)) {
    v.sentence = name + "no default ASAP operator to judge.";
    return v;
  }
  const Op& d = *L.def();
  if (d.kind != "asap") {
    // The layer stores a zero-parameter operator: no ASAP map met the
    // objective on the compiling machine, or (--zero-parameter fallback)
    // the loop was twice as close, or (compete) closer; the decision says which.
    std::string s = name + "the layer stores " + d.label() + " (" + itos(d.passes) +
                    " LSE passes), not an ASAP map (compile's decision line says why); attention error " + fmt(d.err);
    const Op* t = L.teacher();
    if (d.timed() && t && t->timed() && d.kind != "teacher")
      s += ", " + ratio(t->lat / d.lat) + " faster than the teacher";
    v.sentence = s + ".";
    return v;
  }
  std::string s = name + "the default ASAP (k=" + itos(d.steps) + ", " + itos(d.passes) +
                  " LSE passes) has attention error " + fmt(d.err);
  for (const Op* o : L.sink())
    if (o->passes == d.passes && good(o->err)) v.at_passes = o;
  if (d.timed()) {
    s += " at " + svg::fmt_seconds(d.lat);
    const Op* t = L.teacher();
    for (const Op* o : L.sink())
      if (o->timed() && o->lat <= d.lat && good(o->err) && (!v.at_latency || o->err < v.at_latency->err))
        v.at_latency = o;
    if (t && t->timed() && t->lat <= d.lat) {
      // Full Sinkhorn is itself no slower: at this latency the exact answer is available.
      v.at_latency = t;
      v.answer = 0;
      s += "; but the teacher itself (T=" + itos(t->steps) + ", exact) runs no slower, at " + svg::fmt_seconds(t->lat) +
           ", so at this latency there is nothing to gain by approximating";
    } else if (v.at_latency) {
      v.answer = d.err < v.at_latency->err ? 1 : 0;
      s += "; it is " + closer(d.err, v.at_latency->err) +
           " the best Sinkhorn that is no slower (T\xE2\x80\xB2=" + itos(v.at_latency->steps) + ", " +
           fmt(v.at_latency->err) + " at " + svg::fmt_seconds(v.at_latency->lat) + ")";
    } else {
      bool any = false;
      for (const Op* o : L.sink()) any = any || o->timed();
      if (any) {
        v.answer = 1;
        s += "; no reduced Sinkhorn budget is as fast, so at this latency ASAP has no Sinkhorn rival";
      } else {
        s += "; the Sinkhorn budgets were not timed";
      }
    }
  } else {
    s += " (not timed)";
  }
  const bool teacher_wins = v.at_latency && v.at_latency->kind == "teacher";
  if (v.at_passes) {
    if (v.answer < 0) v.answer = d.err < v.at_passes->err ? 1 : 0;
    const bool joined = d.timed() && !teacher_wins && v.at_latency;
    s += std::string(joined ? ", and " : "; at equal passes it is ") + closer(d.err, v.at_passes->err) +
         (joined ? " Sinkhorn at equal passes (" : " Sinkhorn (") + "T\xE2\x80\xB2=" + itos(v.at_passes->steps) + ", " +
         fmt(v.at_passes->err) + ")";
  } else if (L.T > 0 && d.passes >= L.T) {
    s += "; it needs as many LSE passes as the teacher itself (" + itos(L.T) + ")";
  }
  if (!teacher_wins && d.timed() && L.teacher() && L.teacher()->timed()) {
    const double sp = L.teacher()->lat / d.lat;
    s += sp >= 1 ? "; it runs " + ratio(sp) + " faster than the teacher"
                 : "; it runs " + ratio(1 / sp) + " <em>slower</em> than the teacher (" +
                       svg::fmt_seconds(L.teacher()->lat) + ")";
  }
  v.sentence = s + ".";
  return v;
}

// Plausibility checks on the latencies, as HTML sentences: Sinkhorn's
// latency should grow with T', and the teacher (T passes) should cost about
// T/T' times a reduced budget.
std::vector<std::string> timing_notes(const Layer& L) {
  std::vector<std::string> notes;
  const Op* prev = nullptr;
  bool non_monotone = false;
  for (const Op* o : L.sink()) {
    if (!o->timed()) continue;
    if (prev && o->lat < 0.7 * prev->lat) non_monotone = true;
    prev = o;
  }
  if (non_monotone)
    notes.push_back(
        "Sinkhorn latencies do not grow with T\xE2\x80\xB2 here, which suggests timing noise (a busy "
        "machine, or too few repeats).");
  const Op* t = L.teacher();
  if (prev && t && t->timed() && prev->passes > 0 && t->passes > 0) {
    const double per_pass = (t->lat / t->passes) / (prev->lat / prev->passes);
    if (per_pass > 3 || per_pass < 1 / 3.0)
      notes.push_back("The teacher (T=" + itos(t->steps) + ") takes " + svg::fmt_seconds(t->lat) +
                      " but Sinkhorn T\xE2\x80\xB2=" + itos(prev->steps) + " takes " + svg::fmt_seconds(prev->lat) +
                      ": per log-sum-exp pass that is " + ratio(per_pass >= 1 ? per_pass : 1 / per_pass) +
                      (per_pass >= 1 ? " more" : " less") +
                      ", so these timings may not measure the same work (a cold start, or work outside the "
                      "normalization in one of them).");
  }
  return notes;
}

// ---- plots ------------------------------------------------------------------

std::string op_tooltip(const Op& o, const Layer& L) {
  std::string t = o.label() + (o.is_default ? " (default)" : "") + ": attention error " + fmt(o.err) + ", " +
                  itos(o.passes) + " LSE passes";
  if (o.timed()) t += ", " + svg::fmt_seconds(o.lat);
  if (!o.teacher_ending) t += ", ends on the " + L.other_ending() + " marginal";
  return t;
}

svg::Marker op_marker(const Op& o, const std::string& color, const std::string& shape, const Layer& L) {
  svg::Marker m;
  m.color = color;
  m.shape = shape;
  m.filled = o.teacher_ending;
  m.title = op_tooltip(o, L);
  if (!o.teacher_ending) m.opacity = 0.75;
  return m;
}

std::string pareto_plot(const Layer& L, const std::vector<Compared>& cmp, std::string* caption) {
  const bool timed = L.timed;
  auto X = [&](const Op& o) { return timed ? o.lat * 1e3 : static_cast<double>(o.passes); };
  std::vector<double> xs, ys;
  for (const auto& o : L.ops) {
    if (o.kind == "teacher" || !timed || o.timed()) xs.push_back(X(o));
    if (o.kind != "teacher" && o.err > 0) ys.push_back(o.err);
  }
  std::vector<std::pair<std::string, const Layer*>> others;
  for (const auto& c : cmp) {
    auto it = c.layers.find(L.name);
    if (it == c.layers.end()) continue;
    others.push_back({c.label, &it->second});
    for (const Op* a : it->second.asap()) {
      if (timed && !a->timed()) continue;
      xs.push_back(X(*a));
      if (a->err > 0) ys.push_back(a->err);
    }
  }
  svg::Axis ax =
      svg::auto_axis(xs, timed, timed ? "latency per batch (ms, log scale)" : "log-sum-exp passes (latency not timed)");
  if (!timed) {
    ax.integer_ticks = true;
    ax.lo = std::min(ax.lo, 0.5);
  }
  const svg::Axis p_y = svg::auto_axis(ys, true, "attention relative error (log scale)");
  svg::Plot p(660, 390, ax, p_y);
  const std::string other = L.other_ending();
  std::vector<svg::LegendItem> legend{{"Sinkhorn, fewer iterations (T\xE2\x80\xB2)", kSink, "line+marker"},
                                      {"ASAP (k closures)", kAsap, "marker", "diamond"}};
  for (const auto& o : others) legend.push_back({"ASAP \xC2\xB7 " + o.first, kCompare, "marker", "triangle"});
  legend.push_back({"hollow: ends on the " + other + " marginal", "#6b7280", "hollow"});
  legend.push_back({"teacher", kTeacher, "dashed"});
  p.legend(legend);
  if (L.def() && (!timed || L.def()->timed())) {
    // Everything left of the default ASAP costs no more than it.
    p.bar(ax.lo, X(*L.def()), p_y.lo, p_y.hi, "rgba(37,99,235,0.07)",
          timed ? "operators in the shaded region run no slower than the default ASAP"
                : "operators in the shaded region use no more passes than the default ASAP");
    legend.push_back(
        {timed ? "no slower than default ASAP" : "no more passes than default ASAP", "rgba(37,99,235,0.16)", "bar"});
    p.legend(legend);
  }
  if (L.teacher())
    p.vline(X(*L.teacher()), kTeacher,
            "teacher T=" + itos(L.T) + (timed ? " \xC2\xB7 " + svg::fmt_seconds(L.teacher()->lat) : ""));
  std::vector<std::pair<double, double>> curve;
  for (const Op* o : L.sink())
    if (!timed || o->timed()) curve.push_back({X(*o), o->err});
  p.line(curve, kSink, 1.8);
  for (const Op* o : L.sink()) {
    if (timed && !o->timed()) continue;
    p.marker(X(*o), o->err, op_marker(*o, kSink, "circle", L));
    p.label(X(*o), o->err, "T\xE2\x80\xB2=" + itos(o->steps), kSink);
  }
  for (const auto& [label, OL] : others)
    for (const Op* a : OL->asap()) {
      if (timed && !a->timed()) continue;
      svg::Marker m = op_marker(*a, kCompare, "triangle", L);
      m.title = label + ": " + m.title;
      p.marker(X(*a), a->err, m);
      p.label(X(*a), a->err, "k=" + itos(a->steps), kCompare);
    }
  for (const Op* a : L.asap()) {
    if (timed && !a->timed()) continue;
    if (a->is_default) {
      svg::Marker ring;
      ring.color = "#111827";
      ring.filled = false;
      ring.r = 9.5;
      ring.stroke_width = 1.6;
      ring.extra = "fill-opacity=\"0\"";
      p.marker(X(*a), a->err, ring);
    }
    svg::Marker m = op_marker(*a, kAsap, "diamond", L);
    if (a->is_default) m.r = 5.5;
    p.marker(X(*a), a->err, m);
    p.label(X(*a), a->err, a->is_default ? "k=" + itos(a->steps) + " default" : "k=" + itos(a->steps), kAsap,
            a->is_default ? 10 : 5, a->is_default);
  }
  *caption = "Lower is closer to the teacher";
  *caption += timed ? ", further left is faster (median latency of a timed batch). "
                    : ". Latencies were not measured, so the x axis counts log-sum-exp passes instead. ";
  *caption += "The teacher's own error is 0, so it appears as the dashed line at its " +
              std::string(timed ? "latency" : "pass count") + ". Hollow markers end on the " + other +
              " marginal while the teacher ends on the " + (L.ending.empty() ? "other" : L.ending) +
              " one; their error shows the parity zig-zag.";
  return p.build("Pareto plot of attention error against " + std::string(timed ? "latency" : "passes") + " for " +
                 L.name);
}

std::string scatter_plot(const Layer& L, std::string* caption) {
  const size_t n = std::min(L.dual_pred.size(), L.dual_teacher.size());
  std::vector<double> all;
  double se = 0, sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0;
  size_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    const double a = L.dual_teacher[i], b = L.dual_pred[i];
    if (!std::isfinite(a) || !std::isfinite(b)) continue;
    all.push_back(a);
    all.push_back(b);
    se += (a - b) * (a - b);
    sx += a, sy += b, sxx += a * a, syy += b * b, sxy += a * b;
    ++m;
  }
  svg::Axis a = svg::auto_axis(all, false, "teacher centered dual", 0.04);
  if (m == 0) {
    a.lo = -1;
    a.hi = 1;
  }
  svg::Axis b = a;
  b.label = "ASAP predicted dual";
  svg::Plot p(380, 390, a, b);
  p.ml = 52;
  p.mr = 12;
  p.line({{a.lo, a.lo}, {a.hi, a.hi}}, "#9ca3af", 1.2, "5 4");
  // Points carry no tooltips, to keep the page small.
  std::vector<std::pair<double, double>> pts;
  for (size_t i = 0; i < n; ++i) pts.push_back({L.dual_teacher[i], L.dual_pred[i]});
  if (m == 0)
    p.text(0, 0, "no dual sample in the JSON", "#9ca3af", "middle", 0, "nodata");
  else
    p.dots(pts, kAsap, 1.7, 0.28);
  double rmse = L.def() && L.def()->dual_rmse >= 0 ? L.def()->dual_rmse : -1;
  std::string c;
  if (m > 0) {
    const double N = static_cast<double>(m);
    const double cov = sxy / N - sx / N * sy / N, vx = sxx / N - sx / N * sx / N, vy = syy / N - sy / N * sy / N;
    const double r = vx > 0 && vy > 0 ? cov / std::sqrt(vx * vy) : std::nan("");
    if (rmse < 0) rmse = std::sqrt(se / N);
    c = "Dual RMSE <b>" + fmt(rmse) + "</b>" + (L.def() && L.def()->dual_rmse >= 0 ? " over all held-out rows" : "") +
        "; the " + itos(static_cast<int64_t>(m)) + " points sampled here have RMSE " + fmt(std::sqrt(se / N)) +
        (std::isfinite(r) ? " and correlation " + fmt(r) : "") +
        ". Points on the dashed diagonal are predicted exactly; the closures correct what remains.";
  } else {
    c = "No predicted/teacher dual sample in this JSON" + (rmse >= 0 ? "; dual RMSE " + fmt(rmse) : std::string()) +
        ".";
  }
  *caption = c;
  return p.build("Predicted against teacher dual potentials for " + L.name);
}

std::vector<double> heldout_by_k(const Layer& L, std::vector<double>* passes) {
  const std::string name = L.fit.candidate.value_or("");
  for (const auto& c : L.fit.candidates)
    if (!name.empty() && c.name == name) {
      *passes = c.passes;
      return c.errors;
    }
  return {};
}

std::string closures_plot(const Layer& L) {
  std::vector<double> xs, ys;
  for (const auto& o : L.ops) {
    xs.push_back(o.passes);
    if (o.kind != "teacher" && o.err > 0) ys.push_back(o.err);
  }
  std::vector<double> hp;
  const std::vector<double> he = heldout_by_k(L, &hp);
  for (size_t i = 0; i < he.size() && i < hp.size(); ++i)
    if (he[i] > 0) ys.push_back(he[i]), xs.push_back(hp[i]);
  svg::Axis ax = svg::auto_axis(xs, false, "log-sum-exp passes", 0.06);
  ax.integer_ticks = true;
  svg::Plot p(520, 280, ax, svg::auto_axis(ys, true, "attention error"));
  std::vector<svg::LegendItem> legend{{"Sinkhorn T\xE2\x80\xB2", kSink, "line+marker"},
                                      {"ASAP k", kAsap, "line+marker", "diamond"}};
  if (!he.empty()) legend.push_back({"compile held-out", kHeldout, "dashed"});
  p.legend(legend);
  if (L.teacher()) p.vline(L.teacher()->passes, kTeacher, "teacher");
  std::vector<std::pair<double, double>> s, a, h;
  for (const Op* o : L.sink()) s.push_back({o->passes, o->err});
  for (const Op* o : L.asap()) a.push_back({o->passes, o->err});
  for (size_t i = 0; i < he.size() && i < hp.size(); ++i) h.push_back({hp[i], he[i]});
  p.line(h, kHeldout, 1.4, "5 3");
  p.line(s, kSink, 1.6);
  p.line(a, kAsap, 1.6);
  for (const Op* o : L.sink()) p.marker(o->passes, o->err, op_marker(*o, kSink, "circle", L));
  for (const Op* o : L.asap()) {
    svg::Marker m = op_marker(*o, kAsap, "diamond", L);
    if (o->is_default) {
      svg::Marker ring;
      ring.color = "#111827";
      ring.filled = false;
      ring.r = 8.5;
      ring.extra = "fill-opacity=\"0\"";
      p.marker(o->passes, o->err, ring);
    }
    p.marker(o->passes, o->err, m);
  }
  return p.build("Attention error against log-sum-exp passes for " + L.name);
}

std::string heads_plot(const Layer& L) {
  const size_t H = L.per_head.size();
  double mx = 0;
  for (double v : L.per_head)
    if (std::isfinite(v)) mx = std::max(mx, v);
  svg::Axis ax{-0.5, H > 0 ? H - 0.5 : 0.5, false, false, "head"};
  svg::Axis ay{0, mx > 0 ? mx * 1.18 : 1, false, false, "attention error"};
  svg::Plot p(520, 280, ax, ay);
  std::vector<std::pair<double, std::string>> ticks;
  const size_t every = std::max<size_t>(1, (H + 11) / 12);
  for (size_t h = 0; h < H; h += every) ticks.push_back({static_cast<double>(h), itos(static_cast<int64_t>(h))});
  p.category_ticks(ticks);
  const double bar_px = H > 0 ? (520 - p.ml - p.mr) / static_cast<double>(H) : 0;
  const double half = std::min(0.34, 22 / std::max(bar_px, 1.0));  // bars at most 44 px wide
  for (size_t h = 0; h < H; ++h) {
    const double v = L.per_head[h];
    if (!std::isfinite(v)) continue;
    p.bar(h - half, h + half, 0, v, kAsap, "head " + itos(static_cast<int64_t>(h)) + ": " + fmt(v));
    if (bar_px >= 30) p.text(static_cast<double>(h), v, fmt(v), "#1f2937", "middle", -4);
  }
  if (H == 0) p.text(0, ay.hi / 2, "no per-head errors in the JSON", "#9ca3af", "middle", 0, "nodata");
  if (L.def() && L.def()->err > 0 && H > 0) {
    p.hline(L.def()->err, kTeacher, "", "4 3");
    p.legend({{"attention error per head", kAsap, "bar"}, {"layer mean " + fmt(L.def()->err), kTeacher, "dashed"}});
  }
  return p.build("Per-head attention error of the default operator for " + L.name);
}

// ---- tables -----------------------------------------------------------------

// Teacher latency over operator latency: "2.53×", or "36.1× slower" in red.
std::string speedup_cell(double teacher_s, double op_s) {
  if (!(teacher_s > 0) || !(op_s > 0)) return "<td class=\"num na\">\xE2\x80\x93</td>";
  const double sp = teacher_s / op_s;
  if (sp >= 1) return "<td class=\"num\">" + esc(ratio(sp)) + "</td>";
  return "<td class=\"num slower\">" + esc(ratio(1 / sp)) + " slower</td>";
}

std::string cell(double v, bool tiny_is_zero = false) {
  if (!good(v)) return "<td class=\"num na\">\xE2\x80\x93</td>";
  if (tiny_is_zero && v < 1e-5) return "<td class=\"num zero\" title=\"" + esc(fmt(v)) + "\">\xE2\x89\x88" + "0</td>";
  return "<td class=\"num\">" + esc(fmt(v)) + "</td>";
}

std::string operators_table(const Layer& L) {
  std::string o =
      "<table class=\"ops\"><thead><tr><th>operator</th><th title=\"log-sum-exp passes, including the softmax "
      "feature\">LSE passes</th><th>attention error</th><th>head-output RMSE</th><th>layer-output RMSE</th><th>row "
      "marginal error</th><th>column marginal error</th><th>plan KL</th><th>latency</th><th>speedup vs "
      "teacher</th></tr></thead><tbody>\n";
  const double tt = L.teacher() && L.teacher()->timed() ? L.teacher()->lat : -1;
  for (const auto& op : L.ops) {
    std::string cls = op.kind;
    if (op.is_default) cls += " default";
    if (!op.teacher_ending) cls += " other";
    o += "<tr class=\"" + cls + "\"><td class=\"name\"><span class=\"swatch\" style=\"background:" +
         std::string(op.kind == "asap"       ? kAsap
                     : op.kind == "sinkhorn" ? kSink
                                             : kTeacher) +
         "\"></span>" + esc(op.label());
    if (op.is_default) o += " <span class=\"badge\">default</span>";
    if (!op.teacher_ending)
      o += " <span class=\"tag\" title=\"ends on the " + L.other_ending() + " marginal; the teacher ends on the " +
           esc(L.ending) + " marginal\">ends on " + L.other_ending() + "</span>";
    o += "</td><td class=\"num\">" + itos(op.passes) + "</td>";
    o +=
        cell(op.err) + cell(op.head_rmse) + cell(op.layer_rmse) + cell(op.row, true) + cell(op.col, true) + cell(op.kl);
    o += op.timed() ? "<td class=\"num\">" + esc(svg::fmt_seconds(op.lat)) + "</td>"
                    : "<td class=\"num na\">\xE2\x80\x93</td>";
    o += speedup_cell(tt, op.timed() ? op.lat : -1);
    o += "</tr>\n";
  }
  o += "</tbody></table>\n";
  return o;
}

// A candidate's table cell: yes/no, a short number, or a dash when unknown.
std::string cell(const std::optional<bool>& v) { return v ? (*v ? "yes" : "no") : "\xE2\x80\x93"; }
std::string cell(const std::optional<double>& v) { return v ? esc(svg::fmt_short(*v)) : "\xE2\x80\x93"; }

std::string compile_choice(const Layer& L) {
  std::string o = "<div class=\"fit\">";
  const FitView& f = L.fit;
  const double budget = f.pass_budget;
  if (f.has_chosen) {
    // One sentence with whatever the record holds.
    std::string what;
    auto part = [&what](const std::string& p) { what += (what.empty() ? "" : ", ") + p; };
    if (!f.family.empty()) part("family " + esc(f.family));
    if (f.per_head) part(*f.per_head ? "per-head weights" : "weights pooled over heads");
    if (f.slices >= 0) part(esc(svg::fmt_short(f.slices)) + " slices");
    if (f.ridge >= 0) part("ridge " + esc(svg::fmt_short(f.ridge)));
    o += "<p class=\"choice\">Compile chose <b>" + esc(f.candidate.value_or("?")) + "</b>" +
         (what.empty() ? "" : " (" + what + ")");
    if (f.closures >= 0) {
      o += " with <b>k=" + esc(svg::fmt_short(f.closures)) + "</b> closures";
      std::string pp;
      if (f.lse_passes >= 0) pp = esc(svg::fmt_short(f.lse_passes)) + " LSE passes";
      if (budget >= 0) pp += (pp.empty() ? "" : ", ") + std::string("pass budget ") + esc(svg::fmt_short(budget));
      if (!pp.empty()) o += " (" + pp + ")";
    }
    std::string held;
    if (f.heldout_error >= 0) held = "held-out attention error <b>" + esc(fmt(f.heldout_error)) + "</b>";
    if (f.dual_rmse >= 0) held += (held.empty() ? "" : ", ") + std::string("dual RMSE ") + esc(fmt(f.dual_rmse));
    o += held.empty() ? "." : ": " + held + ".";
    o += "</p>";
  }
  std::string cost;
  const std::string& method = f.fit;
  if (f.train_examples >= 0)
    cost = "on " + esc(svg::fmt_short(f.train_examples)) + " training and " + esc(svg::fmt_short(f.heldout_examples)) +
           " held-out examples ";
  if (L.fit_time >= 0) {
    std::string upper = method;
    for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    o += "<p>The " + (method.empty() ? std::string("fit") : esc(method.size() <= 3 ? upper : method) + " fit") + " " +
         cost + "took <b>" + esc(svg::fmt_seconds(L.fit_time)) + "</b>";
    if (f.teacher_time >= 0) o += " (of which " + esc(svg::fmt_seconds(f.teacher_time)) + " running the teacher)";
    if (L.break_even > 0)
      o += "; it pays off after <b>" + esc(svg::fmt_short(std::ceil(L.break_even))) + "</b> calls of the timed batch.";
    else
      o += "; it never pays off in time here, since the default operator is not faster than the teacher.";
    o += "</p>";
  }
  if (!f.has_chosen && L.fit_time < 0) o += "<p class=\"muted\">No compile record in this JSON.</p>";

  if (!f.candidates.empty()) {
    size_t K = 0;
    for (const auto& c : f.candidates) K = std::max(K, c.errors.size());
    std::vector<double> best(K, INFINITY);
    for (const auto& c : f.candidates)
      for (size_t k = 0; k < c.errors.size(); ++k)
        if (std::isfinite(c.errors[k])) best[k] = std::min(best[k], c.errors[k]);
    const std::string chosen_name = f.candidate.value_or("");
    const int chosen_k = static_cast<int>(f.closures);
    o += "<div class=\"scroll\"><table class=\"cands\"><thead><tr><th>candidate</th><th>per-head</th><th>slices</th>"
         "<th>ridge</th><th title=\"log-sum-exp passes of k closures\">passes</th>";
    for (size_t k = 0; k < K; ++k) o += "<th>k=" + itos(static_cast<int64_t>(k + 1)) + "</th>";
    o += "</tr></thead><tbody>\n";
    for (const auto& c : f.candidates) {
      const bool is_chosen = c.name == chosen_name;
      const auto& passes = c.passes;
      // Passes as a function of k ("k+1" with the softmax feature), when it is one.
      std::string rule = "\xE2\x80\x93";
      if (!passes.empty() && std::isfinite(passes[0])) {
        const double off = passes[0] - 1;
        bool affine = true;
        for (size_t k = 0; k < passes.size(); ++k) affine = affine && passes[k] == off + k + 1;
        rule = affine ? (off == 0 ? "k" : "k+" + svg::fmt_short(off)) : "varies";
      }
      o += std::string("<tr") + (is_chosen ? " class=\"chosen\"" : "") + "><td class=\"name\">" + esc(c.name) +
           (is_chosen ? " <span class=\"badge\">chosen</span>" : "") + "</td><td>" + cell(c.per_head) +
           "</td><td class=\"num\">" + cell(c.slices) + "</td><td class=\"num\">" + cell(c.ridge) +
           "</td><td class=\"num\">" + rule + "</td>";
      const auto& e = c.errors;
      for (size_t k = 0; k < K; ++k) {
        if (k >= e.size() || !std::isfinite(e[k])) {
          o += "<td class=\"num na\">\xE2\x80\x93</td>";
          continue;
        }
        const bool has_p = k < passes.size() && std::isfinite(passes[k]);
        std::string cls = "num";
        if (e[k] == best[k]) cls += " best";
        if (has_p && budget >= 0 && passes[k] > budget) cls += " over";
        if (is_chosen && static_cast<int>(k + 1) == chosen_k) cls += " pick";
        o += "<td class=\"" + cls + "\"" +
             (has_p ? " title=\"" + esc(svg::fmt_short(passes[k])) + " LSE passes\"" : std::string()) + ">" +
             esc(fmt(e[k])) + "</td>";
      }
      o += "</tr>\n";
    }
    o += "</tbody></table></div><p class=\"muted small\">Held-out attention error by closures k on compile's held-out "
         "split; bold is the best per column, the outlined cell is the chosen operator";
    if (budget >= 0) o += "; greyed cells exceed the pass budget of " + esc(svg::fmt_short(budget)) + " LSE passes";
    o += ".</p>";
  }
  o += "</div>";
  return o;
}

// ---- page -------------------------------------------------------------------

const char* const kCss = R"CSS(
:root{--fg:#111827;--muted:#6b7280;--line:#e5e7eb;--bg:#fff;--soft:#f8fafc;--asap:#2563eb;--sink:#d9730d;--hl:#fff7d6}
*{box-sizing:border-box}
body{margin:0;background:#f3f4f6;color:var(--fg);font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,"Liberation Sans","DejaVu Sans",sans-serif}
main{max-width:1180px;margin:0 auto;padding:24px 28px 48px}
header h1{font-size:24px;margin:0 0 4px;word-break:break-all}
.note{color:var(--muted);margin:0 0 12px}
.meta{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;font-size:13px;margin:8px 0 0}
.meta dt{color:var(--muted)} .meta dd{margin:0;font-family:"DejaVu Sans Mono","Liberation Mono",monospace;font-size:12px;word-break:break-all}
.card{background:var(--bg);border:1px solid var(--line);border-radius:10px;padding:18px 22px;margin:18px 0;box-shadow:0 1px 2px rgba(0,0,0,.04)}
h2{font-size:19px;margin:0 0 4px;word-break:break-all} h3{font-size:14px;margin:18px 0 6px;color:#374151;text-transform:uppercase;letter-spacing:.04em}
.sub{color:var(--muted);margin:0 0 10px}
.summary p{margin:6px 0}
.verdict{display:inline-block;white-space:nowrap;border-radius:999px;padding:0 9px;font-size:12px;font-weight:600}
.verdict.yes{background:#dcfce7;color:#166534}.verdict.no{background:#fee2e2;color:#991b1b}.verdict.na{background:#e5e7eb;color:#374151}
.figs{display:flex;flex-wrap:wrap;gap:18px;align-items:flex-start}
figure{margin:0;break-inside:avoid;page-break-inside:avoid}
figure.wide{flex:0 1 660px} figure.sq{flex:0 1 380px} figure.mid{flex:0 1 520px}
figcaption{font-size:12px;color:#4b5563;margin-top:4px}
svg.plot{max-width:100%;height:auto;display:block;font-family:inherit}
svg .area{fill:#fff} svg .frame{fill:none;stroke:#9ca3af;stroke-width:1}
svg .grid{stroke:#e5e7eb;stroke-width:1} svg .grid.minor{stroke:#f3f4f6}
svg .tick{font-size:10.5px;fill:#4b5563} svg .axlabel{font-size:12px;fill:#374151}
svg .legend{font-size:11px;fill:#374151}
svg .lbl{font-size:11px;paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}
svg .lbl.bold{font-weight:700} svg .nodata{font-size:12px;fill:#9ca3af}
table{border-collapse:collapse;font-size:12.5px;margin:6px 0}
th,td{padding:4px 9px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{font-weight:600;color:#374151;background:var(--soft);font-size:11.5px}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
table.ops th:not(:first-child),table.cands th:nth-child(n+5){text-align:right}
td.name{white-space:nowrap}
td.na{color:#c0c4cc} td.zero{color:var(--muted)} td.slower{color:#b91c1c}
tr.default td{background:var(--hl);font-weight:600} tr.default td:first-child{box-shadow:inset 3px 0 0 #f59e0b}
tr.other td{color:#6b7280} tr.teacher td{color:#374151;background:#fafafa}
.swatch{display:inline-block;width:9px;height:9px;border-radius:2px;margin-right:6px;vertical-align:0}
.badge{display:inline-block;background:#f59e0b;color:#fff;border-radius:4px;padding:0 5px;font-size:10.5px;font-weight:700;vertical-align:1px}
.tag{display:inline-block;border:1px solid #d1d5db;color:#6b7280;border-radius:4px;padding:0 4px;font-size:10.5px;font-weight:400}
table.cands td.best{font-weight:700} table.cands td.pick{outline:2px solid #f59e0b;outline-offset:-2px;background:var(--hl)}
table.cands tr.chosen td.name{font-weight:600} table.cands .over{color:#b6bbc4}
.choice{margin:4px 0}
.callout{background:#fffbeb;border:1px solid #fde68a;border-radius:8px;padding:6px 10px;font-size:12.5px;margin:8px 0}
.muted{color:var(--muted)} .small{font-size:12px}
.scroll{overflow-x:auto}
footer{color:var(--muted);font-size:12px;text-align:center}
@media print{body{background:#fff} main{max-width:none;padding:0} section.card{box-shadow:none;border:none;border-top:2px solid #e5e7eb;border-radius:0;padding:10px 0;break-before:auto}
 section.layer{break-before:page} .scroll{overflow:visible} h2,h3{break-after:avoid;page-break-after:avoid}
 table,.callout,p.choice{break-inside:avoid;page-break-inside:avoid} @page{margin:12mm}}
)CSS";

// The model first: the sum of the layers' latencies (the model budget's
// measure) and the layer furthest from its teacher relative to plain softmax.
template <class Layers>
std::string model_paragraph(const Layers& layers) {
  if (layers.empty()) return "";
  double t = 0, d = 0, worst = -1, worst_err = -1;
  bool timed = true;
  std::string worst_name;
  for (const auto& L : layers) {
    timed = timed && L.def() && L.def()->timed() && L.teacher() && L.teacher()->timed();
    if (!L.def()) continue;
    if (timed) t += L.teacher()->lat, d += L.def()->lat;
    double softmax = -1;
    for (const auto& op : L.ops)
      if (op.kind == "sinkhorn" && op.steps == 1) softmax = op.err;
    const double e = L.def()->err, n = softmax > 0 && good(e) ? e / softmax : e;
    if (good(e) && n > worst) worst = n, worst_err = e, worst_name = L.name;
  }
  std::string p = "<p class=\"model\"><b>The model";
  p += timed && d > 0 ? " runs at " + ratio(t / d) +
                            " the teachers' speed</b> (sum of the layers' latencies: " + svg::fmt_seconds(d) +
                            " against " + svg::fmt_seconds(t) + ")"
                      : "</b> was not timed";
  if (!worst_name.empty())
    p += "; its largest error is in layer <b>" + esc(worst_name) + "</b> (attention error " + fmt(worst_err) +
         (worst != worst_err ? ", " + fmt(worst) + " of plain softmax's" : std::string()) + ")";
  return p + ".</p>";
}

std::string layer_section(const Layer& L, const Verdict& v, const std::vector<Compared>& cmp, size_t index) {
  std::string o = "<section class=\"card layer\" id=\"layer-" + itos(static_cast<int64_t>(index)) + "\">";
  o += "<h2>" + esc(L.name) + "</h2>";
  o += "<p class=\"sub\">teacher T=" + itos(L.T) + (L.ending.empty() ? "" : ", " + esc(L.ending) + "-ending") + ", " +
       itos(L.examples) + " held-out examples";
  if (L.def()) o += ", default operator ASAP k=" + itos(L.def()->steps) + " (" + itos(L.def()->passes) + " LSE passes)";
  o += "</p>";
  const std::string badge = v.answer == 1   ? "<span class=\"verdict yes\">ASAP closer</span>"
                            : v.answer == 0 ? "<span class=\"verdict no\">Sinkhorn closer</span>"
                                            : "<span class=\"verdict na\">undecided</span>";
  o += "<p>" + badge + " " + v.sentence + "</p>";
  const auto notes = timing_notes(L);
  if (!notes.empty()) {
    o += "<div class=\"callout\"><b>Timing caveat.</b> ";
    for (const auto& n : notes) o += n + " ";
    o += "Read the latency axis with care and compare at equal passes too.</div>";
  }

  std::string pcap, scap;
  const std::string pareto = pareto_plot(L, cmp, &pcap);
  const std::string scatter = scatter_plot(L, &scap);
  o += "<div class=\"figs\"><figure class=\"wide\">" + pareto + "<figcaption><b>Error against " +
       (L.timed ? std::string("latency") : std::string("passes")) + ".</b> " + pcap + "</figcaption></figure>";
  o += "<figure class=\"sq\">" + scatter + "<figcaption><b>Dual potentials.</b> " + scap +
       "</figcaption></figure></div>";

  o += "<div class=\"figs\"><figure class=\"mid\">" + closures_plot(L) +
       "<figcaption><b>Closures and the parity zig-zag.</b> Error against log-sum-exp passes: ASAP k uses k+1 passes "
       "(the softmax feature plus k closures), Sinkhorn T\xE2\x80\xB2 uses T\xE2\x80\xB2. Operators ending on the " +
       L.other_ending() +
       " marginal (hollow) jump up; the dashed line is compile's held-out estimate for the chosen "
       "candidate.</figcaption></figure>";
  o += "<figure class=\"mid\">" + heads_plot(L) +
       "<figcaption><b>Per head.</b> Attention error of the default operator per head; the dashed line is the "
       "layer's mean.</figcaption></figure></div>";

  o += "<h3>Operators</h3><div class=\"scroll\">" + operators_table(L) + "</div>";
  o += "<p class=\"muted small\">Errors are against the teacher on held-out data: attention error is the mean relative "
       "Frobenius error of the attention matrices; plan KL is the generalized KL of the teacher's plan to the "
       "operator's. Marginal errors below 10\xE2\x81\xBB\xE2\x81\xB5 show as \xE2\x89\x88"
       "0 (hover for the value). Speedup is teacher latency over operator latency.</p>";

  // Compared artifacts, default operators side by side.
  std::string rows;
  for (const auto& c : cmp) {
    auto it = c.layers.find(L.name);
    if (it == c.layers.end() || !it->second.def()) continue;
    const Op& d = *it->second.def();
    rows += "<tr><td class=\"name\"><span class=\"swatch\" style=\"background:" + std::string(kCompare) + "\"></span>" +
            esc(c.label) + "</td><td class=\"num\">k=" + itos(d.steps) + "</td>" + cell(d.err) + cell(d.head_rmse) +
            cell(d.kl) +
            (d.timed() ? "<td class=\"num\">" + esc(svg::fmt_seconds(d.lat)) + "</td>"
                       : "<td class=\"num na\">\xE2\x80\x93</td>") +
            "</tr>";
  }
  if (!rows.empty() && L.def()) {
    const Op& d = *L.def();
    o += "<h3>Compared artifacts (default operators)</h3><div class=\"scroll\"><table "
         "class=\"ops\"><thead><tr><th>artifact"
         "</th><th>default</th><th>attention error</th><th>head-output RMSE</th><th>plan KL</th><th>latency</th></tr>"
         "</thead><tbody><tr class=\"default\"><td class=\"name\"><span class=\"swatch\" style=\"background:" +
         std::string(kAsap) + "\"></span>this artifact</td><td class=\"num\">k=" + itos(d.steps) + "</td>" +
         cell(d.err) + cell(d.head_rmse) + cell(d.kl) +
         (d.timed() ? "<td class=\"num\">" + esc(svg::fmt_seconds(d.lat)) + "</td>"
                    : "<td class=\"num na\">\xE2\x80\x93</td>") +
         "</tr>" + rows + "</tbody></table></div>";
  }

  o += "<h3>Compile choice</h3>" + compile_choice(L);
  o += "</section>\n";
  return o;
}

}  // namespace

std::string render_html_report(const nlohmann::json& v, const std::string& title, const std::string& note) {
  std::vector<Layer> layers;
  for (const auto& l : arr(v, "layers")) layers.push_back(read_layer(l));
  const std::string main_fit = str(v, "fit");
  std::vector<Compared> cmp;
  for (const auto& c : arr(v, "compare")) {
    Compared C;
    C.artifact = str(c, "artifact");
    const std::string fit = str(c, "fit");
    C.label = !fit.empty() && fit != main_fit ? "fit " + fit : basename(C.artifact);
    if (C.label.empty()) C.label = "compared artifact " + itos(static_cast<int64_t>(cmp.size() + 1));
    for (const auto& l : arr(c, "layers")) {
      Layer L = read_layer(l);
      C.layers.emplace(L.name, L);
    }
    cmp.push_back(std::move(C));
  }

  std::string o;
  o.reserve(1 << 18);
  o += "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
       "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>" +
       esc(title) + "</title><style>" + kCss + "</style></head><body><main>\n";
  o += "<header class=\"card\"><h1>" + esc(title) + "</h1>";
  if (!note.empty()) o += "<p class=\"note\">" + esc(note) + "</p>";
  o += "<dl class=\"meta\">";
  auto meta = [&](const std::string& k, const std::string& val) {
    if (!val.empty()) o += "<dt>" + esc(k) + "</dt><dd>" + esc(val) + "</dd>";
  };
  meta("artifact", str(v, "artifact"));
  meta("checkpoint", str(v, "checkpoint"));
  meta("data", str(v, "data"));
  meta("fit", main_fit);
  if (num(v, "timed_batch", 0) > 0) meta("timed batch", svg::fmt_short(num(v, "timed_batch")) + " examples per call");
  for (const auto& c : cmp) meta("compared with", c.artifact + " (" + c.label + ")");
  o += "</dl></header>\n";

  // Summary: the question, answered per layer.
  std::vector<Verdict> verdicts;
  int yes = 0, decided = 0;
  bool any_timed = false;
  for (const auto& L : layers) {
    verdicts.push_back(verdict_of(L));
    if (verdicts.back().answer >= 0) ++decided;
    if (verdicts.back().answer == 1) ++yes;
    any_timed = any_timed || (L.def() && L.def()->timed());
  }
  o += "<section class=\"card summary\"><h2>Summary</h2>";
  o += model_paragraph(layers);
  std::string para = "<p><b>At equal " + std::string(any_timed ? "latency" : "cost") +
                     ", is ASAP closer to the teacher than simply running Sinkhorn with fewer iterations?</b> ";
  if (layers.empty())
    para += "This JSON has no layers.";
  else if (decided == 0)
    para += "The data do not allow a comparison.";
  else
    para += (yes == decided ? "Yes"
             : yes == 0     ? "No"
                            : "Partly") +
            std::string(": in ") + itos(yes) + " of " + itos(decided) + (decided == 1 ? " layer" : " layers") +
            " the default ASAP operator beats the best " +
            (any_timed ? "Sinkhorn that runs no slower (fewer iterations, or the teacher's full T)"
                       : "Sinkhorn of equal log-sum-exp passes") +
            ". ";
  for (const auto& vd : verdicts) para += vd.sentence + " ";
  o += para + "</p>";
  if (!layers.empty()) {
    o += "<div class=\"scroll\"><table class=\"ops\"><thead><tr><th>layer</th><th>T</th><th>default</th><th>attention "
         "error</th><th>latency</th><th>speedup vs teacher</th><th>best Sinkhorn no slower</th><th>Sinkhorn at equal "
         "passes</th><th>verdict</th></tr></thead><tbody>\n";
    for (size_t i = 0; i < layers.size(); ++i) {
      const Layer& L = layers[i];
      const Verdict& vd = verdicts[i];
      o += "<tr><td class=\"name\"><a href=\"#layer-" + itos(static_cast<int64_t>(i)) + "\">" + esc(L.name) +
           "</a></td><td class=\"num\">" + itos(L.T) +
           (L.ending.empty() ? "" : " <small>" + esc(L.ending) + "</small>") + "</td>";
      if (L.def()) {
        o += "<td class=\"num\">k=" + itos(L.def()->steps) + "</td>" + cell(L.def()->err);
        o += L.def()->timed() ? "<td class=\"num\">" + esc(svg::fmt_seconds(L.def()->lat)) + "</td>"
                              : "<td class=\"num na\">\xE2\x80\x93</td>";
        o += speedup_cell(L.teacher() && L.teacher()->timed() ? L.teacher()->lat : -1,
                          L.def()->timed() ? L.def()->lat : -1);
      } else {
        o += "<td class=\"na\">\xE2\x80\x93</td><td class=\"na\">\xE2\x80\x93</td><td "
             "class=\"na\">\xE2\x80\x93</td><td class=\"na\">\xE2\x80\x93</td>";
      }
      auto sk = [&](const Op* s) {
        if (!s) return std::string("<td class=\"num na\">\xE2\x80\x93</td>");
        return "<td class=\"num\">" +
               std::string(s->kind == "teacher" ? "teacher" : "T\xE2\x80\xB2=" + itos(s->steps)) + ": " +
               esc(fmt(s->err)) + "</td>";
      };
      o += sk(vd.at_latency) + sk(vd.at_passes);
      o += vd.answer == 1   ? "<td><span class=\"verdict yes\">ASAP closer</span></td>"
           : vd.answer == 0 ? "<td><span class=\"verdict no\">Sinkhorn closer</span></td>"
                            : "<td><span class=\"verdict na\">undecided</span></td>";
      o += "</tr>\n";
    }
    o += "</tbody></table></div>";
  }
  o += "</section>\n";

  for (size_t i = 0; i < layers.size(); ++i) o += layer_section(layers[i], verdicts[i], cmp, i);
  o += "<footer>Generated by asapc. Self-contained: inline SVG and CSS, no scripts, no network.</footer>\n";
  o += "</main></body></html>\n";
  return o;
}

}  // namespace asap
