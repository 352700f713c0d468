// verify: every metric for every layer, the digest check, and gating.
#include <ATen/ATen.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "asap/artifact.h"
#include "asap/calib.h"
#include "asap/checkpoint.h"
#include "asap/compile.h"
#include "asap/error.h"
#include "asap/metrics.h"
#include "asap/teacher.h"
#include "asap/verify.h"
#include "compile_fixture.h"
#include "util/timing.h"

using namespace asap_test;

namespace {
struct Compiled {
  TempDir dir;
  Compiled() {
    write_vit_calib(dir / "calib.h5", 40, 11);
    write_vit_calib(dir / "heldout.h5", 12, 12);
    asap::write_spec(dir / "spec.json", vit_spec(6));
    asap::CompileOptions o;
    o.slice_bank = 8;
    o.objective = asap::Objective::kFidelity;  // ASAP maps, whatever this machine's timings
    auto r = asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o);
    asap::write_artifact(dir / "a.h5", r.artifact);
  }
  // asap::verify of the artifact against the teacher on the held-out file.
  asap::VerifyResult verify(const asap::VerifyOptions& o) const {
    auto art = asap::read_artifact(dir / "a.h5");
    auto ck = asap::load_checkpoint(vit_checkpoint());
    asap::CalibFile data(dir / "heldout.h5");
    return asap::verify(art, dir / "a.h5", ck, data, o);
  }
};
}  // namespace

TEST_CASE("verify's timer: every layer's operators in each round, the medians back to their layer") {
  // A fake clock that each call advances by its own cost, except in round 1,
  // where layer 1's first operator "stalls" for 100 units: round-robin per
  // round over both layers, the median ignores the stall.
  double clock = 0;
  std::vector<std::string> calls;
  int round = -1;  // the warm-up round is -1
  auto op = [&](const std::string& name, double cost, bool first) {
    return [&, name, cost, first] {
      if (first) ++round;
      calls.push_back(name);
      clock += cost + (name == "L1.a" && round == 1 ? 100 : 0);
    };
  };
  const std::vector<std::vector<std::function<void()>>> groups = {{op("L0.a", 1, true), op("L0.b", 2, false)},
                                                                  {op("L1.a", 3, false), op("L1.b", 4, false)}};
  const auto lat = asap::detail::time_groups_round_robin(groups, 1, 3, [&] { return clock; });
  REQUIRE(lat.size() == 2);
  CHECK(lat[0] == std::vector<double>{1, 2});
  CHECK(lat[1] == std::vector<double>{3, 4});
  // One warm-up round and three timed rounds, each calling every layer's
  // operators (timed layer by layer, a slow stretch hits one layer only).
  const std::vector<std::string> round_calls = {"L0.a", "L0.b", "L1.a", "L1.b"};
  REQUIRE(calls.size() == 16);
  for (size_t r = 0; r < 4; ++r)
    CHECK(std::vector<std::string>(calls.begin() + 4 * r, calls.begin() + 4 * r + 4) == round_calls);
}

TEST_CASE("verify: a slow stretch of the machine hits every layer alike (one round-robin over the layers)") {
  // A fake clock: one unit per reading, 10 while the machine is "slow". The
  // slow stretch covers the first two of five timing rounds. With every
  // layer's operators in each round, every operator is slow in 2 of 5 rounds
  // and its median is the fast time. Timed layer by layer, the stretch
  // would cover most of layer 0's rounds and none of layer 1's.
  Compiled c;
  asap::VerifyOptions o;
  o.repeats = 5;
  o.warmup = 0;
  int64_t readings = 0, slow_until = 0;
  double t = 0;
  o.clock = [&] {
    t += readings++ < slow_until ? 10 : 1;
    return t;
  };
  c.verify(o);  // counts the readings: 2 per timed call
  const int64_t per_round = readings / 5;
  REQUIRE(per_round * 5 == readings);
  readings = 0, t = 0, slow_until = 2 * per_round;
  const auto res = c.verify(o);
  REQUIRE(res.layers.size() == 2);
  for (const auto& lv : res.layers)
    for (const auto& op : lv.operators) {
      CAPTURE(lv.name);
      CAPTURE(op.kind);
      CAPTURE(op.steps);
      CHECK(op.latency_s == doctest::Approx(1.0));
    }
}

TEST_CASE("verify: JSON has every metric for every layer and operator") {
  Compiled c;
  asap::VerifyOptions o;
  o.repeats = 1;
  auto j = c.verify(o).to_json();
  REQUIRE(j["layers"].size() == 2);
  for (const auto& l : j["layers"]) {
    CHECK(l["examples"].get<int64_t>() == 12);
    // teacher + ASAP k = 1..5 + Sinkhorn T' = 1..5
    REQUIRE(l["operators"].size() == 11);
    int defaults = 0;
    for (const auto& op : l["operators"]) {
      for (const char* key : {"attention_rel_error", "head_output_rmse", "layer_output_rmse", "row_marginal_error",
                              "col_marginal_error", "teacher_plan_kl"}) {
        CAPTURE(key);
        REQUIRE(op["metrics"].contains(key));
        CHECK(std::isfinite(op["metrics"][key].get<double>()));
        CHECK(op["metrics"][key].get<double>() >= 0);
      }
      CHECK(op["latency_s"].get<double>() > 0);
      if (op["kind"] == "asap") CHECK(op["metrics"]["dual_rmse"].get<double>() >= 0);
      defaults += op["default"].get<bool>();
    }
    CHECK(defaults == 1);
    const auto& teacher = l["operators"][0];
    CHECK(teacher["kind"] == "teacher");
    CHECK(teacher["metrics"]["attention_rel_error"].get<double>() == 0.0);
    // A column-ending teacher's own columns are exact.
    CHECK(teacher["metrics"]["col_marginal_error"].get<double>() < 1e-5);
    CHECK(l["per_head_attention_error"].size() == 2);
    CHECK(l["dual_scatter"]["predicted"].size() == l["dual_scatter"]["teacher"].size());
  }
}

TEST_CASE("verify: artifacts of another checkpoint are refused; --force overrides only the digest") {
  Compiled c;
  auto art = asap::read_artifact(c.dir / "a.h5");
  auto same_weights = asap::load_checkpoint(asap_test::data_path("fixtures/vit_state_dict.pt"));
  CHECK_THROWS_WITH_AS(asap::check_artifact_matches(art, "a.h5", same_weights, false),
                       doctest::Contains("was compiled from a checkpoint with SHA-256"), asap::Error);
  CHECK_NOTHROW(asap::check_artifact_matches(art, "a.h5", same_weights, true));
  auto text = asap::load_checkpoint(asap_test::data_path("fixtures/text_state_dict.pt"));
  CHECK_THROWS_WITH_AS(asap::check_artifact_matches(art, "a.h5", text, true), doctest::Contains("does not contain"),
                       asap::Error);
}

TEST_CASE("verify: the CLI writes the report and exits 1 when a threshold is exceeded") {
  Compiled c;
  const std::string base = std::string(ASAPC_EXE) + " verify " + vit_checkpoint() + " --artifact " + c.dir / "a.h5" +
                           " --data " + c.dir / "heldout.h5" + " --repeats 1 -q --report " + c.dir / "r.html" +
                           " --json-out " + c.dir / "r.json";
  std::string out;
  CHECK(run_cmd(base, &out) == 0);
  CHECK(out.find("ASAP k=") != std::string::npos);
  CHECK(std::filesystem::exists(c.dir / "r.html"));
  CHECK(std::filesystem::exists(c.dir / "r.json"));
  CHECK(run_cmd(base + " --max-attention-error 1e-9", &out) == 1);
  CHECK(out.find("exceeds --max-attention-error") != std::string::npos);
  CHECK(run_cmd(base + " --max-attention-error 10", &out) == 0);
}

TEST_CASE("verify: compile's report equals asapc verify on the same held-out examples") {
  TempDir dir;
  write_vit_calib(dir / "calib.h5", 50, 21);
  asap::write_spec(dir / "spec.json", vit_spec(6));
  const std::string exe = ASAPC_EXE;
  std::string out;
  REQUIRE(run_cmd(exe + " compile " + vit_checkpoint() + " --spec " + dir / "spec.json" + " --calib " +
                      dir / "calib.h5" + " -o " + dir / "m.asap.h5" +
                      " --slices 8 -q --objective fidelity",  // an ASAP map, whatever the timings
                  &out) == 0);
  CHECK(out.find("report: " + dir / "m.report.html") != std::string::npos);
  CHECK(out.find("ASAP-0") != std::string::npos);
  REQUIRE(run_cmd(exe + " verify " + vit_checkpoint() + " --artifact " + dir / "m.asap.h5" + " --data " +
                      dir / "calib.h5" + " --split heldout -q --json-out " + dir / "v.json" + " --report " +
                      dir / "v.html",
                  &out) == 0);
  auto rep = nlohmann::json::parse(std::ifstream(dir / "m.report.json"));
  auto ver = nlohmann::json::parse(std::ifstream(dir / "v.json"));
  REQUIRE(rep["layers"].size() == 2);
  REQUIRE(ver["layers"].size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    const auto &a = rep["layers"][i], &b = ver["layers"][i];
    CHECK(a["examples"] == b["examples"]);
    CHECK(a["examples"].get<int64_t>() < 50);  // only the held-out split
    REQUIRE(a["operators"].size() == b["operators"].size());
    for (size_t k = 0; k < a["operators"].size(); ++k)
      for (const auto& m : a["operators"][k]["metrics"].items()) {
        CAPTURE(m.key());
        CHECK(m.value().get<double>() ==
              doctest::Approx(b["operators"][k]["metrics"][m.key()].get<double>()).epsilon(1e-12));
      }
  }
  // A split too small to say anything is reported as such.
  write_vit_calib(dir / "tiny.h5", 10, 22);
  REQUIRE(run_cmd(exe + " compile " + vit_checkpoint() + " --spec " + dir / "spec.json" + " --calib " +
                      dir / "tiny.h5" + " -o " + dir / "t.asap.h5" + " --slices 8 -q",
                  &out) == 0);
  CHECK(out.find("too few to measure fidelity") != std::string::npos);
  auto tiny = nlohmann::json::parse(std::ifstream(dir / "t.report.json"));
  CHECK(tiny["too_small"].get<bool>());
}

TEST_CASE(
    "metrics: each one equals its formula on a small case; an underflowed entry gives inf KL, a floored KL and its "
    "share") {
  // One example, one head, n = 3 (plan = attention / n), all rows and keys active.
  const int64_t n = 3;
  auto As = at::tensor({0.5, 0.3, 0.2, 0.2, 0.5, 0.3, 0.3, 0.2, 0.5}, at::kDouble).reshape({1, 1, n, n});
  auto A = at::tensor({0.6, 0.4, 0.0, 0.2, 0.4, 0.3, 0.2, 0.2, 0.6}, at::kDouble).reshape({1, 1, n, n});
  auto m = asap::log_marginals(at::Tensor(), 1, n, false, at::kDouble, at::kCPU);
  asap::MetricsAccumulator acc;
  acc.add_attention(A, As, m, true);
  auto r = acc.result();
  double num = 0, den = 0, kl_floor = 0, rows = 0, cols = 0;
  int zeros = 0, support = 0;
  for (int64_t i = 0; i < n; ++i) {
    double rs = 0, cs = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double a = A[0][0][i][j].item<double>(), s = As[0][0][i][j].item<double>();
      num += (a - s) * (a - s);
      den += s * s;
      const double p = s / n, q = std::max(a / n, asap::kKlFloor / n);
      kl_floor += p * std::log(p / q) - p + q;
      zeros += a == 0 && s > 0;
      support += s > 0;
      rs += a;
      cs += A[0][0][j][i].item<double>();
    }
    rows += std::abs(rs - 1);
    cols += std::abs(cs - 1);
  }
  CHECK(r.attention_rel_error == doctest::Approx(std::sqrt(num / den)).epsilon(1e-12));
  CHECK(std::isinf(r.teacher_plan_kl));
  CHECK(r.teacher_plan_kl_floored == doctest::Approx(kl_floor).epsilon(1e-12));
  CHECK(r.plan_zero_share == doctest::Approx(static_cast<double>(zeros) / support));
  CHECK(r.plan_zero_share == doctest::Approx(1.0 / 9));
  CHECK(r.row_marginal_error == doctest::Approx(rows / n).epsilon(1e-12));
  CHECK(r.col_marginal_error == doctest::Approx(cols / n).epsilon(1e-12));
  // Head output RMSE: sqrt of the mean squared difference of O = A V against O* = A* V.
  auto V = at::tensor({1.0, -2.0, 0.5, 3.0, 0.0, -1.0}, at::kDouble).reshape({1, 1, n, 2});
  auto O = at::matmul(A, V), Os = at::matmul(As, V);
  acc.add_head_outputs(O, Os);
  double sq = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < 2; ++c) {
      const double d = O[0][0][i][c].item<double>() - Os[0][0][i][c].item<double>();
      sq += d * d;
    }
  CHECK(acc.result().head_output_rmse == doctest::Approx(std::sqrt(sq / (n * 2))).epsilon(1e-12));
  // Without the zero, the KL is finite and equals the floored one.
  auto A2 = A.clone();
  A2[0][0][0][2] = 0.1;
  asap::MetricsAccumulator acc2;
  acc2.add_attention(A2, As, m, true);
  auto r2 = acc2.result();
  CHECK(std::isfinite(r2.teacher_plan_kl));
  CHECK(r2.teacher_plan_kl == doctest::Approx(r2.teacher_plan_kl_floored).epsilon(1e-12));
  CHECK(r2.plan_zero_share == 0.0);
}

TEST_CASE("verify: the model's line is the sum of the layers' latencies and the layer furthest relative to softmax") {
  // Two layers, numbers chosen by hand: teacher 4 + 6 s, default 2 + 3 s
  // (2x); layer "a" has the larger error (0.2 against 0.15) but "b" the
  // larger one relative to softmax (0.15 / 0.3 = 0.5 against 0.2 / 0.8).
  auto layer = [](const std::string& name, double t, double d, double err, double softmax) {
    asap::LayerVerification l;
    l.name = name;
    asap::OperatorResult teacher, def, sm;
    teacher.kind = "teacher";
    teacher.latency_s = t;
    def.kind = "asap";
    def.steps = 2;
    def.is_default = true;
    def.latency_s = d;
    def.metrics.attention_rel_error = err;
    sm.kind = "sinkhorn";
    sm.steps = 1;
    sm.latency_s = 1;
    sm.metrics.attention_rel_error = softmax;
    l.operators = {teacher, def, sm};
    return l;
  };
  asap::VerifyResult v;
  v.layers = {layer("a", 4, 2, 0.2, 0.8), layer("b", 6, 3, 0.15, 0.3)};
  const auto m = v.model();
  CHECK(m.teacher_latency_s == 10);
  CHECK(m.latency_s == 5);
  CHECK(m.speedup == 2);
  CHECK(m.worst_layer == "b");
  CHECK(m.worst_error == 0.15);
  CHECK(m.worst_normalized == doctest::Approx(0.5));
  CHECK(v.to_json()["model"]["speedup"] == 2.0);
  v.layers[1].operators[1].latency_s = -1;  // one layer not timed: no model speed-up
  CHECK(v.model().speedup == -1);
}
