// The compile pipeline end to end, its choices, and its refusals.
#include <ATen/ATen.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <map>
#include <random>
#include <thread>

#include <fstream>
#include <nlohmann/json.hpp>
#include "asap/artifact.h"
#include "asap/compile.h"
#include "asap/error.h"
#include "asap/runtime.h"
#include "asap/teacher.h"
#include "asap/verify.h"
#include "choice_fixture.h"
#include "compile/choose.h"
#include "compile/phases.h"
#include "compile_fixture.h"
#include "io/layer_stream.h"
#include "util/select.h"

using namespace asap_test;

namespace {

// The compile summary as `asapc compile --json` writes it.
nlohmann::json summary_json(const asap::CompileResult& r) { return r.summary; }

// Latencies by rule, never by clock: the teacher 1 s per pass, Sinkhorn T'
// T' s, ASAP (feature passes + k) s plus `per_slice` s per slice. Counts
// what it is asked to time.
struct RuleLatency : asap::LatencyModel {
  double per_slice = 0.01;
  double asap_extra = 0.2;  // predicting the dual, the projections
  int calls = 0;
  std::vector<std::string> timed;
  std::vector<double> measure(const asap::LayerSpec&, const std::vector<asap::OperatorConfig>& ops) override {
    ++calls;
    std::vector<double> out;
    for (const auto& op : ops) {
      timed.push_back(op.key());
      double t = op.lse_passes();
      if (op.kind == asap::OperatorKind::kAsap) t += asap_extra + per_slice * static_cast<double>(op.family.slices);
      out.push_back(t);
    }
    return out;
  }
  nlohmann::json describe() const override { return {{"source", "rule"}}; }
  bool was_timed(const std::string& key) const { return std::find(timed.begin(), timed.end(), key) != timed.end(); }
};

using asap::compile_detail::OperatorCandidate;

// Teacher T = 6; Sinkhorn T' = 1..5 with errors 0.6, 0.3, 0.2, 0.07, 0.1.
std::vector<OperatorCandidate> synthetic_candidates() {
  using K = asap::OperatorKind;
  std::vector<OperatorCandidate> c{loop_op(K::kTeacher, 6, 0)};
  const double sink[] = {0.6, 0.3, 0.2, 0.07, 0.1};
  for (int t = 1; t <= 5; ++t) c.push_back(loop_op(K::kSinkhorn, t, sink[t - 1]));
  c.push_back(asap_op(64, true, 3, 0.01));  // 4 passes + 0.84: 4.84 s, too slow for 1.25x (4.8 s)
  c.push_back(asap_op(16, true, 2, 0.03));  // 3 passes + 0.36: 3.36 s
  c.push_back(asap_op(0, true, 1, 0.05));   // 2 passes + 0.2: 2.2 s
  c.push_back(asap_op(0, false, 6, 0.02));  // 6 passes: bound 0.9 * 6 s > 4.8 s, never timed
  return c;
}

}  // namespace

TEST_CASE("compile: is_feature_family accepts the families compile parses and nothing else") {
  for (const char* f : asap::kDefaultFeatureFamilies) CHECK(asap::is_feature_family(f));
  for (const char* f : {"alpha", "alpha+softmax", "alpha+softmax+sinkhorn3", "alpha+stats", "alpha+softmax+stats",
                        "alpha+softmax+sinkhorn3+stats", "slices+alpha+softmax+stats", "alpha+cstats",
                        "alpha+softmax+sinkhorn3+cstats", "slices+alpha+cstats"})
    CHECK_MESSAGE(asap::is_feature_family(f), f);
  // +stats needs alpha, comes last and once; aliases are the CLI's, not compile's.
  for (const char* f : {"", "stats", "slices+stats", "+stats", "alpha+stats+stats", "alpha+softmax+stats+sinkhorn3",
                        "softmax", "slices+", "alpha+", "paper", "all", "Alpha", "cstats", "slices+cstats",
                        "alpha+stats+cstats", "alpha+cstats+stats", "alpha+cstats+cstats"})
    CHECK_MESSAGE(!asap::is_feature_family(f), f);
  // +cstats is the five statistics columns, +stats the first three.
  auto fam = asap::compile_detail::family_of("alpha+cstats", 1);
  CHECK((fam.alpha && fam.score_stats && fam.centered_stats && fam.num_columns() == 6));
  fam = asap::compile_detail::family_of("alpha+stats", 1);
  CHECK((fam.score_stats && !fam.centered_stats && fam.num_columns() == 4));
}

TEST_CASE("compile: choice on known latencies -- each objective, lazy timing, Sinkhorn and fallback") {
  auto spec = vit_spec(6).layers[0];
  asap::compile_detail::ChoiceOptions o;
  SUBCASE("min-speedup: the most accurate within teacher / 1.25, timing only what could win") {
    auto c = synthetic_candidates();
    RuleLatency lat;
    o.chunk = 1;  // one candidate per timing call, so that what is timed is what the scan reached
    auto ch = asap::compile_detail::choose_operator(c, spec, o, lat);
    REQUIRE(ch.index >= 0);
    CHECK(c[static_cast<size_t>(ch.index)].name == "L16+alpha+softmax k=2");
    CHECK(ch.target_met);
    CHECK(ch.teacher_latency == doctest::Approx(6.0));
    CHECK(c[static_cast<size_t>(ch.index)].latency == doctest::Approx(3.36));
    CHECK(lat.was_timed("asap-L64+alpha+softmax-k3"));  // more accurate: had to be timed, and is too slow
    CHECK(lat.was_timed("asap-alpha-k6"));  // more accurate too: timed whatever its passes (no latency bound skips it)
    CHECK(!lat.was_timed("asap-alpha+softmax-k1"));  // less accurate than the winner: never timed
    CHECK(ch.decision.find("L16+alpha+softmax k=2") == 0);
    CHECK(ch.decision.find("1.79x") != std::string::npos);
    CHECK(ch.decision.find("sinkhorn T'=3") != std::string::npos);  // the best Sinkhorn no slower: T' <= 3.36 s
  }
  SUBCASE("min-speedup: plain Sinkhorn wins when every ASAP map is slow, and the decision says so") {
    auto c = synthetic_candidates();
    RuleLatency lat;
    lat.per_slice = 1.0;
    lat.asap_extra = 3.0;
    auto ch = asap::compile_detail::choose_operator(c, spec, o, lat);
    CHECK(c[static_cast<size_t>(ch.index)].op.kind == asap::OperatorKind::kSinkhorn);
    CHECK(c[static_cast<size_t>(ch.index)].op.steps == 4);
    CHECK(ch.target_met);
    CHECK(ch.decision.find("no ASAP map runs at 1.25x") != std::string::npos);
  }
  SUBCASE("min-speedup: an unreachable speed-up falls back to the most accurate faster than the teacher") {
    auto c = synthetic_candidates();
    RuleLatency lat;
    o.min_speedup = 100;
    auto ch = asap::compile_detail::choose_operator(c, spec, o, lat);
    CHECK(!ch.target_met);
    CHECK(c[static_cast<size_t>(ch.index)].name == "L64+alpha+softmax k=3");  // 4.84 s < 6 s
    CHECK(ch.decision.find("no operator reaches 100.00x") != std::string::npos);
  }
  SUBCASE("max-error: the fastest within the bound") {
    auto c = synthetic_candidates();
    RuleLatency lat;
    o.objective = asap::Objective::kMaxError;
    o.max_error = 0.08;
    auto ch = asap::compile_detail::choose_operator(c, spec, o, lat);
    CHECK(c[static_cast<size_t>(ch.index)].name == "alpha+softmax k=1");  // 0.05 at 2.2 s; T'=4 is 0.07 at 4 s
    CHECK(ch.target_met);
    o.max_error = 0.001;  // only the teacher
    auto c2 = synthetic_candidates();
    auto ch2 = asap::compile_detail::choose_operator(c2, spec, o, lat);
    CHECK(c2[static_cast<size_t>(ch2.index)].op.kind == asap::OperatorKind::kTeacher);
  }
  SUBCASE("fidelity: the most accurate ASAP map within the pass budget, whatever its latency") {
    auto c = synthetic_candidates();
    RuleLatency lat;
    o.objective = asap::Objective::kFidelity;
    o.pass_budget = 4;
    auto ch = asap::compile_detail::choose_operator(c, spec, o, lat);
    CHECK(c[static_cast<size_t>(ch.index)].name == "L64+alpha+softmax k=3");
  }
  SUBCASE("a fixed --closures restricts ASAP candidates to that k") {
    auto c = synthetic_candidates();
    RuleLatency lat;
    o.fixed_closures = 1;
    auto ch = asap::compile_detail::choose_operator(c, spec, o, lat);
    CHECK(c[static_cast<size_t>(ch.index)].name == "alpha+softmax k=1");
  }
}

namespace {

// Latencies from a table keyed like --latency-table (OperatorConfig::key()).
struct MapLatency : asap::LatencyModel {
  std::map<std::string, double> t;
  int calls = 0;
  std::vector<double> measure(const asap::LayerSpec&, const std::vector<asap::OperatorConfig>& ops) override {
    ++calls;
    std::vector<double> out;
    for (const auto& op : ops) out.push_back(t.at(op.key()));
    return out;
  }
  nlohmann::json describe() const override { return {{"source", "map"}}; }
};

// The choice by its definition, with every candidate timed: what
// choose_operator must return however little it times.
int exhaustive_choice(const std::vector<OperatorCandidate>& c, const asap::compile_detail::ChoiceOptions& o,
                      const MapLatency& lat) {
  auto latency = [&](int i) { return lat.t.at(c[static_cast<size_t>(i)].op.key()); };
  const double t0 = latency(0);
  std::vector<int> ok;
  for (int i = 0; i < static_cast<int>(c.size()); ++i) {
    const auto& x = c[static_cast<size_t>(i)];
    if (x.selectable &&
        (o.fixed_closures == 0 || x.op.kind != asap::OperatorKind::kAsap || x.op.closures == o.fixed_closures))
      ok.push_back(i);
  }
  auto more_accurate = [&](int a, int b) {  // error, then passes, then candidate order
    const auto &x = c[static_cast<size_t>(a)], &y = c[static_cast<size_t>(b)];
    if (x.error != y.error) return x.error < y.error;
    if (x.op.lse_passes() != y.op.lse_passes()) return x.op.lse_passes() < y.op.lse_passes();
    return a < b;
  };
  auto best_of = [&](auto keep) {
    int best = -1;
    for (int i : ok)
      if (keep(i) && (best < 0 || more_accurate(i, best))) best = i;
    return best;
  };
  auto fastest_within = [&](double bound) {  // ties by accuracy
    int best = -1;
    for (int i : ok)
      if (c[static_cast<size_t>(i)].error <= bound &&
          (best < 0 || latency(i) < latency(best) || (latency(i) == latency(best) && more_accurate(i, best))))
        best = i;
    return best;
  };
  // Maps first: the most accurate map, unless the most accurate operator is
  // plain Sinkhorn or the teacher at most half as far (errors floored at 0.03).
  auto first = [&](auto keep) {
    const int any = best_of(keep);
    if (!o.maps_first || any < 0 || c[static_cast<size_t>(any)].op.kind == asap::OperatorKind::kAsap) return any;
    const int map =
        best_of([&](int j) { return keep(j) && c[static_cast<size_t>(j)].op.kind == asap::OperatorKind::kAsap; });
    if (map < 0) return any;
    return 2 * std::max(0.03, c[static_cast<size_t>(any)].error) <= std::max(0.03, c[static_cast<size_t>(map)].error)
               ? any
               : map;
  };
  if (o.objective == asap::Objective::kMinSpeedup) {
    int i = first([&](int j) { return latency(j) <= t0 / o.min_speedup; });
    if (i < 0) i = first([&](int j) { return latency(j) < t0; });
    if (i < 0) i = best_of([](int) { return true; });
    // --guard: over `guard` times plain softmax's error, the fastest within it.
    double softmax = 1;
    for (const auto& x : c)
      if (x.op.kind == asap::OperatorKind::kSinkhorn && x.op.steps == 1) softmax = x.error;
    if (o.guard > 0 && c[static_cast<size_t>(i)].error > o.guard * softmax) {
      const int g = fastest_within(o.guard * softmax);  // never slower than the teacher
      if (g >= 0 && latency(g) <= t0) i = g;
    }
    return i;
  }
  const int best = fastest_within(o.max_error);  // kMaxError
  return best >= 0 ? best : best_of([](int) { return true; });
}

}  // namespace

TEST_CASE("compile: the choice equals the exhaustive one when ASAP maps cost less than Sinkhorn of equal passes") {
  auto spec = vit_spec(6).layers[0];
  using K = asap::OperatorKind;
  asap::compile_detail::ChoiceOptions o;
  SUBCASE("a 5-pass map at 0.6x the 5-pass loop, more accurate than every operator within 1.5x") {
    // Target 6 s / 1.5 = 4 s. The map's 5 passes cost 5 s as a loop, so a
    // bound of 0.9x that (4.5 s) skipped it; it runs in 3 s.
    std::vector<OperatorCandidate> c{loop_op(K::kTeacher, 6, 0)};
    const double sink[] = {0.6, 0.3, 0.2, 0.07, 0.1};
    for (int t = 1; t <= 5; ++t) c.push_back(loop_op(K::kSinkhorn, t, sink[t - 1]));
    c.push_back(asap_op(0, true, 4, 0.01));   // 1 + 4 = 5 passes
    c.push_back(asap_op(16, true, 2, 0.05));  // 3 passes
    MapLatency lat;
    lat.t = {{"teacher", 6},
             {"sinkhorn-1", 1},
             {"sinkhorn-2", 2},
             {"sinkhorn-3", 3},
             {"sinkhorn-4", 4},
             {"sinkhorn-5", 5},
             {"asap-alpha+softmax-k4", 3.0},
             {"asap-L16+alpha+softmax-k2", 3.5}};
    o.min_speedup = 1.5;
    auto ch = asap::compile_detail::choose_operator(c, spec, o, lat);
    CHECK(c[static_cast<size_t>(ch.index)].name == "alpha+softmax k=4");
    CHECK(ch.index == exhaustive_choice(c, o, lat));
    CHECK(ch.target_met);
    // Under --max-error the same map is the fastest within 0.06.
    o.objective = asap::Objective::kMaxError;
    o.max_error = 0.06;
    auto c2 = c;
    auto ch2 = asap::compile_detail::choose_operator(c2, spec, o, lat);
    CHECK(c2[static_cast<size_t>(ch2.index)].name == "alpha+softmax k=4");  // 3 s; L16 k=2: 3.5 s
  }
  SUBCASE("random tables: maps at 0.3x to 1.5x the loop of their passes, every objective") {
    std::mt19937_64 rng(28);
    std::uniform_real_distribution<double> u(0, 1);
    int asap_wins = 0, cases = 0, refused = 0, guarded = 0, passed_over = 0, zero_closer = 0;
    for (int trial = 0; trial < 300; ++trial) {
      std::vector<OperatorCandidate> c{loop_op(K::kTeacher, 6, 0)};
      MapLatency lat;
      const double pass = 0.5 + u(rng), fixed = 2 * u(rng);  // a loop of p passes: fixed + p * pass
      lat.t["teacher"] = fixed + 6 * pass;
      for (int t = 1; t <= 5; ++t) {
        c.push_back(loop_op(K::kSinkhorn, t, 0.05 + 0.5 * u(rng)));
        lat.t["sinkhorn-" + std::to_string(t)] = fixed + t * pass;
      }
      for (int m = 0; m < 12; ++m) {
        const int64_t slices[] = {0, 4, 16, 64};
        auto x = asap_op(slices[rng() % 4], rng() % 2 == 0, 1 + static_cast<int>(rng() % 4), 0.5 * u(rng));
        c.push_back(x);
        if (!lat.t.count(x.op.key())) lat.t[x.op.key()] = (fixed + x.op.lse_passes() * pass) * (0.3 + 1.2 * u(rng));
      }
      if (trial % 3 == 0)  // --no-zero-parameter: only the maps are selectable
        for (auto& x : c) x.selectable = x.op.kind == K::kAsap;
      const bool parametric = trial % 3 == 0;
      const bool maps_first = trial % 3 == 1;  // --zero-parameter fallback (trial % 3 == 2: compete)
      for (int obj = 0; obj < 4; ++obj) {
        CAPTURE(trial);
        CAPTURE(obj);
        asap::compile_detail::ChoiceOptions oo;
        oo.parametric_only = parametric;
        oo.maps_first = maps_first;
        if (obj < 3) {
          oo.min_speedup = std::vector<double>{1.05, 1.25, 2.0}[static_cast<size_t>(obj)];
          if (trial % 2 == 1) oo.guard = 0.1 + 0.5 * u(rng);  // --budget layer's --guard
        } else {
          oo.objective = asap::Objective::kMaxError;
          oo.max_error = 0.05 + 0.3 * u(rng);
        }
        auto cc = c;
        const int want = exhaustive_choice(c, oo, lat);
        int got = -2;
        try {
          const auto ch = asap::compile_detail::choose_operator(cc, spec, oo, lat);
          got = ch.index;
          if (ch.unguarded >= 0) {  // the guard replaced the budget's choice: not met, and said
            ++guarded;
            CHECK_FALSE(ch.target_met);
            CHECK(cc[static_cast<size_t>(ch.unguarded)].error > oo.guard * cc[1].error);
            CHECK(ch.decision.find("within the guard") != std::string::npos);
          }
          if (ch.passed_over >= 0 && ch.unguarded < 0) {  // maps first stored a map over a closer loop
            ++passed_over;
            REQUIRE(maps_first);
            CHECK(cc[static_cast<size_t>(ch.index)].op.kind == K::kAsap);
            CHECK(cc[static_cast<size_t>(ch.passed_over)].op.kind != K::kAsap);
            CHECK(cc[static_cast<size_t>(ch.passed_over)].error < cc[static_cast<size_t>(ch.index)].error);
            CHECK(ch.decision.find("ASAP maps first: " + cc[static_cast<size_t>(ch.passed_over)].name) !=
                  std::string::npos);
          }
          if (maps_first && oo.objective == asap::Objective::kMinSpeedup && ch.unguarded < 0 && ch.target_met &&
              cc[static_cast<size_t>(ch.index)].op.kind == K::kSinkhorn &&
              ch.decision.find("at least twice as close as every ASAP map") != std::string::npos)
            ++zero_closer;
        } catch (const asap::Error&) {
          got = -1;  // --no-zero-parameter and no map meets the bar: refused
        }
        if (got == -1) {
          ++refused;
          // Refused only when no map meets the objective's weakest bar.
          REQUIRE(parametric);
          if (oo.objective == asap::Objective::kMaxError)
            CHECK(c[static_cast<size_t>(want)].error > oo.max_error);
          else
            CHECK(lat.t.at(c[static_cast<size_t>(want)].op.key()) >= lat.t.at("teacher"));
          continue;
        }
        ++cases;
        CHECK(got == want);
        asap_wins += c[static_cast<size_t>(want)].op.kind == K::kAsap;
      }
    }
    CHECK(cases > 800);  // every non-parametric case and some parametric ones
    CHECK(refused > 0);
    CHECK(asap_wins > 200);   // the maps win often enough for the comparison to mean something
    CHECK(guarded > 50);      // and the guard fires often enough
    CHECK(passed_over > 10);  // maps first passes over a more accurate loop
    CHECK(zero_closer > 5);   // and takes one twice as close
  }
}

TEST_CASE("compile: errors and latencies within rounding are ties, broken by passes, then candidate order") {
  auto spec = vit_spec(6).layers[0];
  using K = asap::OperatorKind;
  // Three maps whose errors differ by 2e-7 relative, as a 1- and a
  // 2-process compile's do: the one with fewer passes, then the first,
  // wins whichever is lower.
  for (double d : {-2e-8, 0.0, 2e-8}) {
    CAPTURE(d);
    std::vector<OperatorCandidate> c{loop_op(K::kTeacher, 6, 0)};
    for (int t = 1; t <= 5; ++t) c.push_back(loop_op(K::kSinkhorn, t, 0.5));
    c.push_back(asap_op(16, true, 3, 0.1 + d));  // 4 passes
    c.push_back(asap_op(16, true, 2, 0.1));      // 3 passes
    c.push_back(asap_op(4, true, 2, 0.1 - d));   // 3 passes, later in the list
    MapLatency lat;
    lat.t = {{"teacher", 6},
             {"sinkhorn-1", 1},
             {"sinkhorn-2", 2},
             {"sinkhorn-3", 3},
             {"sinkhorn-4", 4},
             {"sinkhorn-5", 5},
             {"asap-L16+alpha+softmax-k3", 3},
             {"asap-L16+alpha+softmax-k2", 3},
             {"asap-L4+alpha+softmax-k2", 3}};
    asap::compile_detail::ChoiceOptions o;
    auto ch = asap::compile_detail::choose_operator(c, spec, o, lat);
    CHECK(c[static_cast<size_t>(ch.index)].name == "L16+alpha+softmax k=2");
    // The fastest within an error bound: equal latencies, the more accurate (then fewer passes, then first).
    o.objective = asap::Objective::kMaxError;
    o.max_error = 0.2;
    auto c2 = c;
    ch = asap::compile_detail::choose_operator(c2, spec, o, lat);
    CHECK(c2[static_cast<size_t>(ch.index)].name == "L16+alpha+softmax k=2");
  }
}

TEST_CASE("compile: --no-zero-parameter finds a map or names the bar none met") {
  auto spec = vit_spec(6).layers[0];
  asap::compile_detail::ChoiceOptions o;
  o.parametric_only = true;
  auto parametric = [] {
    auto c = synthetic_candidates();
    for (auto& x : c) x.selectable = x.op.kind == asap::OperatorKind::kAsap;
    return c;
  };
  SUBCASE("a map that meets the speed-up") {
    auto c = parametric();
    RuleLatency lat;
    auto ch = asap::compile_detail::choose_operator(c, spec, o, lat);
    CHECK(c[static_cast<size_t>(ch.index)].name == "L16+alpha+softmax k=2");
    CHECK(ch.target_met);
  }
  SUBCASE("no map reaches 1.25x: the most accurate one faster than the teacher, said so") {
    auto c = parametric();
    RuleLatency lat;
    lat.asap_extra = 2.9;  // 2 passes: 4.9 s (> 4.8 s, < 6 s); the others 6.06 s and more
    auto ch = asap::compile_detail::choose_operator(c, spec, o, lat);
    CHECK(!ch.target_met);
    CHECK(c[static_cast<size_t>(ch.index)].name == "alpha+softmax k=1");
    CHECK(ch.decision.find("no operator reaches 1.25x") != std::string::npos);
  }
  SUBCASE("no map is faster than the teacher: one sentence naming both bars") {
    auto c = parametric();
    RuleLatency lat;
    lat.asap_extra = 10;
    CHECK_THROWS_WITH_AS(asap::compile_detail::choose_operator(c, spec, o, lat),
                         "layer 'transformer.layers.0.0.fn': no ASAP map reaches 1.25x the teacher's speed "
                         "(--min-speedup), nor is any faster than the teacher (the fastest, alpha+softmax k=1, runs "
                         "at 0.50x), and --no-zero-parameter rules out plain Sinkhorn and the teacher",
                         asap::Error);
  }
  SUBCASE("no map within --max-error: one sentence naming the bound") {
    auto c = parametric();
    RuleLatency lat;
    o.objective = asap::Objective::kMaxError;
    o.max_error = 0.005;
    CHECK_THROWS_WITH_AS(asap::compile_detail::choose_operator(c, spec, o, lat),
                         "layer 'transformer.layers.0.0.fn': no ASAP map reaches held-out attention error 0.005 "
                         "(--max-error; the most accurate, L64+alpha+softmax k=3, has 0.01), and --no-zero-parameter "
                         "rules out plain Sinkhorn and the teacher",
                         asap::Error);
  }
  SUBCASE("no map to choose from at all") {
    auto c = parametric();
    c.resize(6);  // the teacher and Sinkhorn only, neither selectable
    RuleLatency lat;
    CHECK_THROWS_WITH_AS(asap::compile_detail::choose_operator(c, spec, o, lat),
                         doctest::Contains("no ASAP map is left to choose from"), asap::Error);
  }
}

TEST_CASE(
    "compile: fixture ViT end to end under --objective fidelity, choices respect the budget and are the held-out "
    "best") {
  TempDir dir;
  write_vit_calib(dir / "calib.h5", 60, 1);
  asap::write_spec(dir / "spec.json", vit_spec(6));
  asap::CompileOptions o;
  o.slice_bank = 16;
  o.objective = asap::Objective::kFidelity;
  o.latency = std::make_shared<RuleLatency>();
  auto r = asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o);
  REQUIRE(r.artifact.layers.size() == 2);
  CHECK(r.artifact.teacher_sha256 == asap::load_checkpoint(vit_checkpoint()).sha256);
  for (size_t i = 0; i < 2; ++i) {
    const auto& L = r.artifact.layers[i];
    const nlohmann::json s = summary_json(r)["layers"][i];
    REQUIRE(L.kind == asap::OperatorKind::kAsap);
    CHECK(L.coef.size(1) == L.family.num_columns());
    CHECK(L.coef.size(0) == (L.per_head ? 2 : 1));
    CHECK(L.theta.sizes() == std::vector<int64_t>{16, L.family.slices});  // the bank prefix the family uses
    CHECK(s["data_driven_selection"].get<bool>());
    CHECK(s["train_examples"].get<int64_t>() + s["heldout_examples"].get<int64_t>() == 60);
    const int budget = s["pass_budget"];
    CHECK(budget == 4);
    CHECK(asap::lse_passes(L.family, L.default_closures) <= budget);
    // The chosen operator is the lowest held-out attention error among the
    // operators within the budget (a k-matched fit only at its k), and it
    // is one of them.
    const double chosen = s["chosen"]["heldout_attention_error"];
    double best_within = 1e300;
    int operators_within = 0;
    for (const auto& c : s["candidates"]) {
      const auto& errs = c["heldout_attention_error_by_k"];
      const auto& passes = c["lse_passes_by_k"];
      REQUIRE(errs.size() == passes.size());
      for (size_t k = 0; k < errs.size(); ++k) {
        if (c["target"] == "k-matched" && static_cast<int>(k) + 1 != c["target_closures"].get<int>()) continue;
        if (passes[k].get<int>() > budget) continue;
        ++operators_within;
        best_within = std::min(best_within, errs[k].get<double>());
      }
    }
    CHECK(operators_within > 10);
    CHECK(chosen == best_within);
    // Every phase was timed (none left at 0), and the phases fit in the layer's time.
    double phases = 0;
    for (const char* phase : {"read", "teacher", "features", "statistics", "solve", "selection", "latency"}) {
      CAPTURE(phase);
      CHECK(s["phase_times_s"][phase].get<double>() > 0.0);
      phases += s["phase_times_s"][phase].get<double>();
    }
    CHECK(phases <= s["fit_time_s"].get<double>());
    CHECK(s["latency"]["source"]["source"] == "rule");
    asap::write_artifact(dir / "a.h5", r.artifact);
  }
  // Artifact round trip: the reloaded layer computes the same outputs.
  auto back = asap::CompiledModel::load(dir / "a.h5");
  at::manual_seed(3);
  auto x = at::randn({2, 17, 32});
  asap::CompiledModel mem(r.artifact);
  for (const auto& name : back->layer_names()) CHECK_CLOSE_T(back->forward(name, x), mem.forward(name, x), 0.0);
}

TEST_CASE("compile: the default objective on known latencies, Sinkhorn errors match the reference loop") {
  TempDir dir;
  write_vit_calib(dir / "calib.h5", 60, 1);
  asap::write_spec(dir / "spec.json", vit_spec(6));
  asap::CompileOptions o;
  o.slice_bank = 16;
  o.selection_examples = 6;
  o.layers = {"transformer.layers.0.0.fn"};
  auto lat = std::make_shared<RuleLatency>();
  o.latency = lat;
  auto r = asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o);
  const nlohmann::json s = summary_json(r)["layers"][0];
  CHECK(s["objective"]["name"] == "min-speedup");
  // The stored operator is the most accurate one of the table within 6 s / 1.25.
  const auto& table = s["latency"]["choice"]["operators"];
  const double chosen = s["chosen"]["heldout_attention_error"];
  CHECK(s["chosen"]["latency_s"].get<double>() <= 4.8 + 1e-9);
  // Every operator more accurate than the chosen one was timed and is too
  // slow; none within 4.8 s is more accurate (the untimed ones included).
  int more_accurate = 0;
  for (const auto& op : table) {
    if (!op["selectable"].get<bool>() || op["heldout_attention_error"].get<double>() >= chosen) continue;
    ++more_accurate;
    CAPTURE(op["operator"].get<std::string>());
    REQUIRE(!op["latency_s"].is_null());
    CHECK(op["latency_s"].get<double>() > 4.8);
  }
  CHECK(more_accurate > 0);  // the target decided the choice
  CHECK(s["target_met"].get<bool>());
  // Sinkhorn T' = 1..5 errors against the ATen reference loop on the same held-out examples.
  auto ck = asap::load_checkpoint(vit_checkpoint());
  asap::CalibFile calib(dir / "calib.h5");
  const asap::TeacherSpec tspec = asap::read_spec(dir / "spec.json");
  const auto& spec = *tspec.find("transformer.layers.0.0.fn");
  asap::LayerStream stream(calib, spec, ck, false);
  std::vector<int64_t> idx;
  for (int64_t e = 0; e < 60 && idx.size() < 6; ++e)
    if (asap::in_heldout_split(1234, 0.2, e)) idx.push_back(e);
  auto b = stream.read_indices(idx);
  const auto conv = asap::convention_of(spec);
  auto At =
      asap::run_teacher_reference(b.q, b.k, at::Tensor(), b.mask, spec.score_scale, 6, conv, true).A.to(at::kDouble);
  for (int Tp = 1; Tp <= 5; ++Tp) {
    auto A =
        asap::run_teacher_reference(b.q, b.k, at::Tensor(), b.mask, spec.score_scale, Tp, conv, true).A.to(at::kDouble);
    const double ref = ((A - At).pow(2).sum({-2, -1}).sqrt() / At.pow(2).sum({-2, -1}).sqrt()).mean().item<double>();
    CHECK(s["sinkhorn_heldout_attention_error"][Tp - 1].get<double>() == doctest::Approx(ref).epsilon(1e-4));
  }
}

TEST_CASE("compile: a layer where plain Sinkhorn wins stores it, it round-trips and runs as the teacher loop") {
  TempDir dir;
  write_vit_calib(dir / "calib.h5", 60, 1);
  asap::write_spec(dir / "spec.json", vit_spec(6));
  asap::CompileOptions o;
  o.slice_bank = 8;
  o.selection_examples = 6;
  auto lat = std::make_shared<RuleLatency>();
  lat->asap_extra = 10;  // no ASAP map is faster than the teacher
  o.latency = lat;
  o.budget = asap::BudgetScope::kLayer;  // each layer's own decision line
  auto r = asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o);
  for (size_t i = 0; i < 2; ++i) {
    const auto& L = r.artifact.layers[i];
    const nlohmann::json s = summary_json(r)["layers"][i];
    REQUIRE(L.kind == asap::OperatorKind::kSinkhorn);
    // The most accurate Sinkhorn budget within 4.8 s: T' <= 4.
    int best = 1;
    for (int t = 1; t <= 4; ++t)
      if (s["sinkhorn_heldout_attention_error"][t - 1].get<double>() <
          s["sinkhorn_heldout_attention_error"][best - 1].get<double>())
        best = t;
    CHECK(L.sinkhorn_steps == best);
    CHECK(s["chosen"]["operator"] == "sinkhorn");
    CHECK(s["decision"].get<std::string>().find("no ASAP map runs at 1.25x") != std::string::npos);
  }
  asap::write_artifact(dir / "s.h5", r.artifact);
  auto back = asap::CompiledModel::load(dir / "s.h5");
  CHECK(back->artifact().format_version == 4);
  at::manual_seed(4);
  auto q = at::randn({2, 2, 17, 16}), k = at::randn({2, 2, 17, 16}), v = at::randn({2, 2, 17, 16});
  for (const auto& L : back->artifact().layers) {
    auto ref = asap::run_teacher_reference(q, k, v, at::Tensor(), L.spec.score_scale, L.sinkhorn_steps,
                                           asap::convention_of(L.spec), false);
    CHECK_CLOSE_T(back->attend(L.spec.name, q, k, v).out, ref.O, 1e-5);
    asap::RunOptions ro;
    ro.closures = 2;
    CHECK_THROWS_WITH_AS(back->attend(L.spec.name, q, k, v, at::Tensor(), ro),
                         doctest::Contains("has no closures to set"), asap::Error);
  }
}

TEST_CASE("compile: families without slices are candidates, --no-zero-parameter keeps ASAP maps only") {
  TempDir dir;
  write_vit_calib(dir / "calib.h5", 60, 1);
  asap::write_spec(dir / "spec.json", vit_spec(6));
  asap::CompileOptions o;
  o.selection_examples = 6;
  o.layers = {"transformer.layers.0.0.fn"};
  o.candidates = {{"alpha+softmax+sinkhorn3", true}, {"alpha", false}};
  auto lat = std::make_shared<RuleLatency>();
  lat->asap_extra = 4.5;  // the 1-pass alpha map runs in 5.5 s: faster than the teacher's 6 s, not 1.25x
  o.latency = lat;
  o.zero_parameter = asap::ZeroParameter::kNever;
  auto r = asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o);
  const auto& L = r.artifact.layers[0];
  CHECK(L.kind == asap::OperatorKind::kAsap);
  CHECK(L.family.slices == 0);
  CHECK(L.theta.size(1) == 0);                                     // the artifact keeps the bank prefix the family uses
  CHECK(!summary_json(r)["layers"][0]["target_met"].get<bool>());  // nothing ASAP reaches 1.25x here
  CHECK(summary_json(r)["layers"][0]["chosen"]["latency_s"].get<double>() < 6.0);
  lat->asap_extra = 10;  // no map is faster than the teacher: refused, not the teacher stored
  CHECK_THROWS_WITH_AS(asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o),
                       doctest::Contains("nor is any faster than the teacher"), asap::Error);
  o.candidates = std::vector<asap::Candidate>{asap::Candidate{"alpha+sinkhorn3", false}};
  CHECK_THROWS_WITH_AS(asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o),
                       doctest::Contains("unknown feature set 'alpha+sinkhorn3'"), asap::Error);
}

TEST_CASE("compile: a latency table from a file drives the choice, a missing key is named") {
  TempDir dir;
  write_vit_calib(dir / "calib.h5", 60, 1);
  asap::write_spec(dir / "spec.json", vit_spec(6));
  const std::string loops =
      R"("teacher": 6, "sinkhorn-1": 1, "sinkhorn-2": 2, "sinkhorn-3": 3, "sinkhorn-4": 4, "sinkhorn-5": 5)";
  {
    std::ofstream f(dir / "lat.json");
    f << "{\"*\": {" << loops << "}}";
  }
  asap::CompileOptions o;
  o.candidates = {{"alpha", false}};
  o.layers = {"transformer.layers.0.0.fn"};
  o.selection_examples = 6;
  o.zero_parameter = asap::ZeroParameter::kNever;  // the alpha maps must be timed
  o.latency = asap::latency_table_from_file(dir / "lat.json");
  CHECK_THROWS_WITH_AS(asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o),
                       doctest::Contains("has no latency for operator 'asap-alpha-k"), asap::Error);
  {
    std::ofstream f(dir / "lat.json");
    f << "{\"transformer.layers.0.0.fn\": {" << loops
      << R"(, "asap-alpha-k1": 0.5, "asap-alpha-k2": 0.6, "asap-alpha-k3": 0.7, "asap-alpha-k4": 0.8, "asap-alpha-k5": 5.5}})";
  }
  o.latency = asap::latency_table_from_file(dir / "lat.json");
  auto r = asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o);
  const nlohmann::json s = summary_json(r)["layers"][0];
  CHECK(s["latency"]["source"]["source"] == "table");
  const int k = r.artifact.layers[0].default_closures;
  CHECK(k <= 4);  // k = 5 takes 5.5 s > 6 s / 1.25
  CHECK(s["chosen"]["latency_s"].get<double>() == doctest::Approx(0.4 + 0.1 * k));
  {
    std::ofstream f(dir / "bad.json");
    f << "{not json";
  }
  CHECK_THROWS_WITH_AS(asap::latency_table_from_file(dir / "bad.json"), doctest::Contains("is not valid JSON"),
                       asap::Error);
}

TEST_CASE("compile: a fixed family, ridge, slices and closures are honoured") {
  TempDir dir;
  write_vit_calib(dir / "calib.h5", 30, 2);
  asap::write_spec(dir / "spec.json", vit_spec(6));
  asap::CompileOptions o;
  o.slice_bank = 8;
  o.fixed_slices = 8;
  o.ridge = 0.5;
  o.closures = 1;
  o.candidates = {{"slices", false}};
  o.layers = {"transformer.layers.1.0.fn"};
  auto r = asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o);
  REQUIRE(r.artifact.layers.size() == 1);
  const auto& L = r.artifact.layers[0];
  CHECK(L.spec.name == "transformer.layers.1.0.fn");
  CHECK(L.family == asap::FeatureFamily{8, false, false});
  CHECK(!L.per_head);
  CHECK(L.default_closures == 1);
  CHECK(summary_json(r)["layers"][0]["chosen"]["ridge"].get<double>() == 0.5);
}

namespace {

// The held-out attention error of an artifact's stored operator (layer 0),
// measured by asap::verify on the compile's held-out split (seed 1234,
// fraction 0.2) of `calib`: independent of what compile recorded.
double verified_heldout_error(const asap::Artifact& art, const std::string& calib) {
  asap::VerifyOptions vo;
  vo.time = false;
  vo.reduced_budgets = false;
  vo.example_filter = [](int64_t e) { return asap::in_heldout_split(1234, 0.2, e); };
  asap::CalibFile data(calib);
  const auto res = asap::verify(art, "in memory", asap::load_checkpoint(vit_checkpoint()), data, vo);
  for (const auto& op : res.layers.at(0).operators)
    if (op.is_default) return op.metrics.attention_rel_error;
  FAIL("no default operator");
  return -1;
}

}  // namespace

TEST_CASE("compile: --fit kl reports convergence and keeps the LS family") {
  TempDir dir;
  write_vit_calib(dir / "calib.h5", 80, 4);  // 80: enough held-out examples to compare KL with LS
  asap::write_spec(dir / "spec.json", vit_spec(6));
  asap::CompileOptions o;
  o.slice_bank = 8;
  o.fit = asap::FitKind::kKl;
  o.kl_ridge = 1e-4;
  o.objective = asap::Objective::kFidelity;
  o.layers = {"transformer.layers.0.0.fn"};
  auto r = asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o);
  const nlohmann::json kl = summary_json(r)["layers"][0]["kl"];
  CHECK(kl["iterations"].get<int>() >= 1);
  CHECK(kl["converged"].get<bool>());
  // The KL fit lowers the training-set teacher-plan KL of the LS warm start.
  CHECK(kl["train_kl"].get<double>() <= kl["train_kl_ls"].get<double>() + 1e-12);
  const auto& hist = kl["per_ridge"][0]["history"];
  for (size_t i = 1; i < hist.size(); ++i)
    CHECK(hist[i]["objective"].get<double>() < hist[i - 1]["objective"].get<double>());
  // KL never ends worse than its LS warm start on held-out attention error:
  // either it is no worse, or the LS coefficients are what the artifact holds.
  const double e_ls = kl["heldout_attention_error_ls"].get<double>(),
               e_kl = kl["heldout_attention_error_kl"].get<double>();
  o.fit = asap::FitKind::kLs;
  o.objective = asap::Objective::kFidelity;  // the same operator as the KL compile's, whatever the timings
  auto ls = asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o);
  const bool fell_back = kl["fell_back_to_ls"];
  CHECK(at::equal(r.artifact.layers[0].coef, ls.artifact.layers[0].coef) == fell_back);
  // Measured apart from compile's own bookkeeping: the stored operator is
  // never worse than LS on the held-out split, and its error is the smaller
  // of the two the record gives.
  const double stored = verified_heldout_error(r.artifact, dir / "calib.h5");
  const double ls_art = verified_heldout_error(ls.artifact, dir / "calib.h5");
  CHECK(stored <= ls_art * (1 + 1e-6));
  CHECK(stored == doctest::Approx(std::min(e_kl, e_ls)).epsilon(1e-4));
  CHECK(ls_art == doctest::Approx(e_ls).epsilon(1e-4));
  // A KL fit held near zero by a huge ridge ends worse than LS: the LS
  // coefficients are what the artifact stores.
  o.fit = asap::FitKind::kKl;
  o.kl_ridge = 1e4;
  auto shrunk = asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o);
  CHECK(summary_json(shrunk)["layers"][0]["kl"]["fell_back_to_ls"].get<bool>());
  CHECK(verified_heldout_error(shrunk.artifact, dir / "calib.h5") <= ls_art * (1 + 1e-6));
}

TEST_CASE("compile: --fit attention refines the chosen map and never ends worse than LS on held-out data") {
  TempDir dir;
  write_vit_calib(dir / "calib.h5", 80, 4);
  asap::write_spec(dir / "spec.json", vit_spec(6));
  asap::CompileOptions o;
  o.slice_bank = 8;
  o.fit = asap::FitKind::kAttention;
  o.attention_iters = 15;
  o.objective = asap::Objective::kFidelity;
  o.layers = {"transformer.layers.0.0.fn"};
  auto r = asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o);
  const nlohmann::json L = summary_json(r)["layers"][0];
  REQUIRE(L.contains("attention_fit"));
  const auto& af = L["attention_fit"];
  CHECK(af["closures"].get<int>() == r.artifact.layers[0].default_closures);
  CHECK(af["iterations"].get<int>() >= 1);
  // L-BFGS with an Armijo line search lowers the training objective.
  CHECK(af["train_objective"].get<double>() < af["train_objective_ls"].get<double>());
  // The refit's best held-out objective is below its LS start here (it is
  // the LS start by construction when nothing improves on it).
  CHECK(af["heldout_objective"].get<double>() < af["heldout_objective_ls"].get<double>());
  o.fit = asap::FitKind::kLs;
  auto ls = asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o);
  const double e_ls = af["heldout_attention_error_ls"].get<double>(),
               e_re = af["heldout_attention_error_refit"].get<double>();
  CHECK(
      e_ls ==
      doctest::Approx(summary_json(ls)["layers"][0]["chosen"]["heldout_attention_error"].get<double>()).epsilon(1e-6));
  const bool fell_back = af["fell_back_to_ls"];
  CHECK(at::equal(r.artifact.layers[0].coef, ls.artifact.layers[0].coef) == fell_back);
  CHECK(r.artifact.layers[0].family.name() == ls.artifact.layers[0].family.name());
  // As for KL: measured by verify, never worse than LS, and the record's numbers are the operator's.
  const double stored = verified_heldout_error(r.artifact, dir / "calib.h5");
  const double ls_art = verified_heldout_error(ls.artifact, dir / "calib.h5");
  CHECK(stored <= ls_art * (1 + 1e-6));
  CHECK(stored == doctest::Approx(std::min(e_re, e_ls)).epsilon(1e-4));
  CHECK(ls_art == doctest::Approx(e_ls).epsilon(1e-4));
}

TEST_CASE("compile: without enough held-out examples to check it, the default attention refit keeps LS and says so") {
  TempDir dir;
  write_vit_calib(dir / "calib.h5", 12, 4);  // about 2 held-out examples, fewer than min_heldout
  asap::write_spec(dir / "spec.json", vit_spec(6));
  asap::CompileOptions o;  // the default fit: the attention refit
  o.slice_bank = 8;
  o.layers = {"transformer.layers.0.0.fn"};
  auto r = asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o);
  const nlohmann::json L = summary_json(r)["layers"][0];
  REQUIRE(L.contains("attention_fit"));
  CHECK(L["attention_fit"]["skipped"].get<std::string>().find("to check the refit against, so the LS coefficients "
                                                              "are kept") != std::string::npos);
  o.fit = asap::FitKind::kLs;
  auto ls = asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o);
  CHECK(at::equal(r.artifact.layers[0].coef, ls.artifact.layers[0].coef));
}

TEST_CASE("compile: refuses T = 1, a layer missing from the calibration file, a width mismatch, NaN") {
  TempDir dir;
  write_vit_calib(dir / "calib.h5", 12, 5);
  asap::CompileOptions o;
  asap::write_spec(dir / "t1.json", vit_spec(1));
  CHECK_THROWS_WITH_AS(asap::compile_teacher(vit_checkpoint(), dir / "t1.json", dir / "calib.h5", o),
                       doctest::Contains("has T = 1 (plain softmax): there is no Sinkhorn loop to amortize"),
                       asap::Error);
  auto spec = vit_spec(6);
  spec.layers[1].name = "blocks.9.attn";
  asap::write_spec(dir / "renamed.json", spec);
  // validate_spec passes (same tensors), the calibration file lacks the layer.
  CHECK_THROWS_WITH_AS(asap::compile_teacher(vit_checkpoint(), dir / "renamed.json", dir / "calib.h5", o),
                       doctest::Contains("has no layer 'blocks.9.attn'"), asap::Error);
  // Activations of the wrong width.
  asap::write_spec(dir / "spec.json", vit_spec(6));
  asap::CalibLayerData d;
  d.name = "transformer.layers.0.0.fn";
  d.x = at::randn({12, 17, 24});
  asap::write_calib(dir / "narrow.h5", {d});
  o.layers = {"transformer.layers.0.0.fn"};
  CHECK_THROWS_WITH_AS(
      asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "narrow.h5", o),
      doctest::Contains("has activations of width d_model = 24 but the checkpoint's projections expect 32"),
      asap::Error);
  // Sequence length against the ViT position embedding [1, 17, 32].
  d.x = at::randn({12, 9, 32});
  asap::write_calib(dir / "short.h5", {d});
  CHECK_THROWS_WITH_AS(asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "short.h5", o),
                       doctest::Contains("has sequences of n = 9 tokens but checkpoint"), asap::Error);
  write_vit_calib(dir / "nan.h5", 12, 6, true);
  CHECK_THROWS_WITH_AS(asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "nan.h5", o),
                       doctest::Contains("example 5"), asap::Error);
}

TEST_CASE("compile: the CLI refuses bad input with exit code 2 and one sentence") {
  TempDir dir;
  std::string out;
  CHECK(run_cmd(std::string(ASAPC_EXE) + " compile " + dir / "missing.pt" + " --spec x --calib y -o " + dir / "a.h5",
                &out) == 2);
  CHECK(out.find("asapc: error: cannot open checkpoint") != std::string::npos);
  CHECK(!std::filesystem::exists(dir / "a.h5"));
  // A negative --selection-examples; objectives and their numbers.
  asap::write_spec(dir / "spec.json", vit_spec(6));
  write_vit_calib(dir / "calib.h5", 12, 3);
  const std::string base = std::string(ASAPC_EXE) + " compile " + vit_checkpoint() + " --spec " + dir / "spec.json" +
                           " --calib " + dir / "calib.h5" + " -q -o " + dir / "a.h5";
  CHECK(run_cmd(base + " --objective fastest", &out) == 2);
  CHECK(out.find("--objective must be min-speedup, max-error or fidelity, found 'fastest'") != std::string::npos);
  CHECK(run_cmd(base + " --objective max-error", &out) == 2);
  CHECK(out.find("--objective max-error needs --max-error E") != std::string::npos);
  CHECK(run_cmd(base + " --max-error 0.1", &out) == 2);
  CHECK(out.find("--max-error needs --objective max-error") != std::string::npos);
  CHECK(run_cmd(base + " --min-speedup 0", &out) == 2);
  CHECK(out.find("--min-speedup takes a finite number > 0, found '0'") != std::string::npos);
  // The model budget's flags.
  CHECK(run_cmd(base + " --budget network", &out) == 2);
  CHECK(out.find("--budget must be 'model' or 'layer', found 'network'") != std::string::npos);
  CHECK(run_cmd(base + " --model-error mean", &out) == 2);
  CHECK(out.find("--model-error must be 'auto', 'max' or 'sum', found 'mean'") != std::string::npos);
  CHECK(run_cmd(base + " --layer-weights 1,0", &out) == 2);
  CHECK(out.find("--layer-weights takes") != std::string::npos);
  CHECK(run_cmd(base + " --latency-noise -0.1", &out) == 2);
  CHECK(out.find("--latency-noise takes") != std::string::npos);
  CHECK(run_cmd(base + " --latency-noise 1.5", &out) == 2);
  CHECK(out.find("--latency-noise must be a fraction below 1") != std::string::npos);
  CHECK(run_cmd(base + " --layer-weights 1,2,3", &out) == 2);  // the spec has 2 layers
  CHECK(out.find("--layer-weights gives 3 weight(s) for 2 compiled layer(s)") != std::string::npos);
  CHECK(run_cmd(base + " --deploy-batch 0", &out) == 2);
  CHECK(out.find("--deploy-batch takes an integer >= 1, found '0'") != std::string::npos);
  CHECK(run_cmd(base + " --features alpha+sinkhorn3", &out) == 2);
  CHECK(out.find("--features takes slices") != std::string::npos);
  CHECK(run_cmd(base + " --latency-table " + dir / "none.json", &out) == 2);
  CHECK(out.find("cannot be opened") != std::string::npos);
  // Lists take commas as well as spaces (issue 16, item 2); a slice list of
  // only 0 leaves the paper's map without columns, which is skipped (item 1).
  CHECK(run_cmd(base + " --slice-counts 0,1 --features slices,alpha --ridge-grid 0,1e-3 --no-report", &out) == 0);
  CHECK(run_cmd(base + " --slice-counts 0 --no-report", &out) == 0);
  std::filesystem::remove(dir / "a.h5");
  CHECK(run_cmd(base + " --selection-examples -1", &out) == 2);
  CHECK(out.find("--selection-examples takes an integer >= 0, found '-1'") != std::string::npos);
  CHECK(!std::filesystem::exists(dir / "a.h5"));
}

TEST_CASE("compile: a compile killed between writing and renaming leaves the old artifact and one temporary") {
  // A kill at the worst moment, injected (no timing): the artifact is fully
  // written to OUT.tmp-XXXXXXXX but not yet renamed over OUT.
  TempDir dir;
  write_vit_calib(dir / "calib.h5", 40, 7);
  asap::write_spec(dir / "spec.json", vit_spec(6));
  { std::ofstream(dir / "out.h5") << "previous"; }
  const std::string cmd = "ASAP_TEST_KILL_BEFORE_RENAME=1 " + std::string(ASAPC_EXE) + " compile " + vit_checkpoint() +
                          " --spec " + dir / "spec.json" + " --calib " + dir / "calib.h5" + " -o " + dir / "out.h5" +
                          " -q --no-report --objective fidelity";
  std::string out;
  CHECK(run_cmd(cmd, &out) == 128 + SIGKILL);  // the shell reports the kill
  std::string previous;
  std::getline(std::ifstream(dir / "out.h5"), previous);
  CHECK(previous == "previous");  // the old file is untouched
  std::vector<std::string> temps;
  for (const auto& e : std::filesystem::directory_iterator(dir.path)) {
    const std::string f = e.path().filename();
    if (f.rfind("out.h5.tmp-", 0) == 0) temps.push_back(e.path());
  }
  REQUIRE(temps.size() == 1);                               // what such a kill leaves behind (README)
  CHECK(asap::read_artifact(temps[0]).layers.size() == 2);  // complete, just not renamed
  // Without the kill the same command replaces the old file.
  CHECK(run_cmd(cmd.substr(cmd.find(' ') + 1), &out) == 0);
  CHECK(asap::read_artifact(dir / "out.h5").layers.size() == 2);
}

TEST_CASE("compile: an example whose scores overflow is named and refused, or excluded under --skip-bad-examples") {
  TempDir dir;
  asap::write_spec(dir / "spec.json", vit_spec(6));
  auto compile = [&](const std::string& calib, bool skip) {
    asap::CompileOptions o;
    o.slice_bank = 8;
    o.objective = asap::Objective::kFidelity;
    o.skip_bad_examples = skip;
    return asap::compile_teacher(vit_checkpoint(), dir / "spec.json", calib, o);
  };
  // The same 60 examples, then with example 7 scaled to 1e30 (finite, but its scores overflow).
  write_vit_calib(dir / "good.h5", 60, 1);
  at::manual_seed(1);
  std::vector<asap::CalibLayerData> layers;
  for (const char* name : {"transformer.layers.0.0.fn", "transformer.layers.1.0.fn"}) {
    asap::CalibLayerData d;
    d.name = name;
    d.x = at::randn({60, 17, 32});
    layers.push_back(d);
  }
  layers[0].x[7] = layers[0].x[7] * 1e30f;
  asap::write_calib(dir / "bad.h5", layers);

  const std::string msg = error_of([&] { compile(dir / "bad.h5", false); });
  CHECK(msg.find("layer 'transformer.layers.0.0.fn' example 7 has activations up to") != std::string::npos);
  CHECK(msg.find("--skip-bad-examples") != std::string::npos);

  auto good = compile(dir / "good.h5", false);
  auto skipped = compile(dir / "bad.h5", true);
  const nlohmann::json s0 = summary_json(skipped)["layers"][0];
  CHECK(s0["excluded_examples"] == std::vector<int64_t>{7});
  CHECK(summary_json(skipped)["layers"][1]["excluded_examples"].empty());
  CHECK(s0["train_examples"].get<int64_t>() + s0["heldout_examples"].get<int64_t>() == 59);
  // Without the example, layer 0 is fitted as well as on clean data: no silent degradation.
  const double e_good = summary_json(good)["layers"][0]["chosen"]["heldout_attention_error"];
  const double e_skip = s0["chosen"]["heldout_attention_error"];
  CHECK(std::isfinite(e_skip));
  CHECK(e_skip < 1.5 * e_good + 1e-3);
}

TEST_CASE("compile: k-matched targets -- with T = 6, the 3-step dual is f3 itself, so k = 3 reproduces the teacher") {
  // T = 6: the row dual after T - 3 = 3 half-steps is the sinkhorn3 feature
  // column, so the k-matched map for k = 3 is that column with weight 1 and
  // its three closures are the teacher's last three half-steps.
  TempDir dir;
  write_vit_calib(dir / "calib.h5", 80, 6);
  asap::write_spec(dir / "spec.json", vit_spec(6));
  asap::CompileOptions o;
  o.slice_bank = 4;
  o.objective = asap::Objective::kFidelity;
  o.max_passes = 6;
  o.candidates = {{"alpha+softmax+sinkhorn3", true}};
  o.float64 = true;
  auto r = asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o);
  for (const auto& s : summary_json(r).at("layers").get<std::vector<nlohmann::json>>()) {
    bool found = false;
    for (const auto& c : s["candidates"]) {
      if (c["target"] != "k-matched" || c["target_closures"] != 3) continue;
      found = true;
      CHECK(c["heldout_dual_rmse"].get<double>() < 1e-6);
      CHECK(c["heldout_attention_error_by_k"][2].get<double>() < 1e-6);
    }
    CHECK(found);
    // Only k with T - k odd have a matched target (k = 3, 5 for T = 6).
    for (const auto& c : s["candidates"])
      if (c["target"] == "k-matched") CHECK((c["target_closures"] == 3 || c["target_closures"] == 5));
    CHECK(s["chosen"]["target"] == "k-matched");
    CHECK(s["chosen"]["heldout_attention_error"].get<double>() < 1e-6);
  }
  // --fit kl leaves a chosen k-matched map with its LS coefficients and says so.
  o.fit = asap::FitKind::kKl;
  auto kl = asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o);
  for (size_t i = 0; i < kl.artifact.layers.size(); ++i) {
    REQUIRE(summary_json(kl)["layers"][i]["chosen"]["target"] == "k-matched");
    CHECK(summary_json(kl)["layers"][i]["kl"].contains("skipped"));
    CHECK(at::equal(kl.artifact.layers[i].coef, r.artifact.layers[i].coef));
  }
  o.fit = asap::FitKind::kLs;
  // --targets closure-ready leaves them out.
  o.targets = asap::Targets::kClosureReady;
  auto cr = asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o);
  for (const auto& s : summary_json(cr).at("layers").get<std::vector<nlohmann::json>>())
    for (const auto& c : s["candidates"]) CHECK(c["target"] == "closure-ready");
}

TEST_CASE("compile and verify select layers by name: all, or the named ones in order, or the caller's sentence") {
  struct Named {
    std::string name;
  };
  const std::vector<Named> all = {{"a"}, {"b"}, {"c"}};
  auto name_of = [](const Named& x) { return x.name; };
  auto missing = [](const std::string& n) { return "no layer '" + n + "' here"; };
  const auto every = asap::detail::select_by_name(all, {}, name_of, missing);
  REQUIRE(every.size() == 3);
  CHECK(every[0] == &all[0]);
  CHECK(every[2] == &all[2]);
  const auto some = asap::detail::select_by_name(all, {"c", "a"}, name_of, missing);
  REQUIRE(some.size() == 2);
  CHECK(some[0] == &all[2]);
  CHECK(some[1] == &all[0]);
  CHECK_THROWS_WITH_AS(asap::detail::select_by_name(all, {"b", "z"}, name_of, missing), "no layer 'z' here",
                       asap::Error);
}

TEST_CASE("compile: --fit and --targets parse to their enums and back, and refuse other names in one sentence") {
  for (auto f : {asap::FitKind::kLs, asap::FitKind::kKl, asap::FitKind::kAttention})
    CHECK(asap::parse_fit(asap::fit_name(f)) == f);
  for (auto t : {asap::Targets::kBoth, asap::Targets::kClosureReady, asap::Targets::kKMatched})
    CHECK(asap::parse_targets(asap::targets_name(t)) == t);
  CHECK(std::string(asap::fit_name(asap::FitKind::kKl)) == "kl");
  CHECK(std::string(asap::targets_name(asap::Targets::kKMatched)) == "k-matched");
  CHECK_THROWS_WITH_AS(asap::parse_fit("LS"), "--fit must be 'ls', 'kl' or 'attention', found 'LS'", asap::Error);
  CHECK_THROWS_WITH_AS(asap::parse_targets("k"), "--targets must be both, closure-ready or k-matched, found 'k'",
                       asap::Error);
}
