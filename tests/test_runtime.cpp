// The public runtime: golden operator through CompiledLayer, precision,
// thread safety, and input checks.
#include <ATen/ATen.h>

#include <limits>
#include <thread>

#include "asap/error.h"
#include "asap/runtime.h"
#include "test_util.h"

using asap_test::load_json;
using asap_test::tensor_from_json;

namespace {

asap::CompiledLayer golden_layer(const nlohmann::json& c) {
  asap::CompiledLayer L;
  auto& s = L.spec;
  s.name = "golden";
  s.layout = asap::ProjLayout::kNone;
  s.heads = 1;
  s.head_dim = c["d"];
  s.value_dim = 3;
  s.score_scale = c["score_scale"];
  s.T = 6;
  L.theta = tensor_from_json(c["Theta"]);
  L.family.slices = L.theta.size(1);
  L.coef = tensor_from_json(c["coef"]).unsqueeze(0);
  L.default_closures = 3;
  return L;
}

at::Tensor bh(const at::Tensor& t) { return t.unsqueeze(0).unsqueeze(0); }

}  // namespace

TEST_CASE("runtime: golden operator for k = 1..4 in float64 and float32") {
  auto j = load_json("operator.json");
  for (const auto& c : j["cases"]) {
    auto L = golden_layer(c);
    auto Q = bh(tensor_from_json(c["Q"])), K = bh(tensor_from_json(c["K"])), V = bh(tensor_from_json(c["V"]));
    auto mask = tensor_from_json(c["key_mask"]).gt(0.5).unsqueeze(0);
    for (int k = 1; k <= 4; ++k) {
      CAPTURE(k);
      asap::RunOptions o;
      o.closures = k;
      o.return_attention = true;
      auto expect = tensor_from_json(c["A_by_closures"][std::to_string(k)]);
      auto r64 = asap::run_layer(L, Q, K, V, mask, o);
      CHECK_CLOSE_T(r64.attention[0][0], expect, 1e-10);
      CHECK_CLOSE_T(r64.out[0][0], at::matmul(expect, V[0][0]), 1e-10);
      auto r32 = asap::run_layer(L, Q.to(at::kFloat), K.to(at::kFloat), V.to(at::kFloat), mask, o);
      CHECK((r32.out.scalar_type() == at::kFloat));
      CHECK_CLOSE_T(r32.attention[0][0], expect, 1e-5);
    }
    // Default closures come from the layer.
    auto def = asap::run_layer(L, Q, K, V, mask);
    CHECK_CLOSE_T(def.out[0][0], at::matmul(tensor_from_json(c["A_by_closures"]["3"]), V[0][0]), 1e-10);
    CHECK_FALSE(def.attention.defined());
  }
}

TEST_CASE("runtime: concurrent calls on one loaded model agree with sequential calls") {
  auto j = load_json("operator.json");
  asap::Artifact art;
  art.layers.push_back(golden_layer(j["cases"][1]));
  const asap::CompiledModel model(art, "mem");
  at::manual_seed(1);
  std::vector<at::Tensor> qs, ks, vs, expect(8), got(8);
  for (int i = 0; i < 8; ++i) {
    qs.push_back(at::randn({2, 1, 12, 8}));
    ks.push_back(at::randn({2, 1, 12, 8}));
    vs.push_back(at::randn({2, 1, 12, 3}));
    expect[i] = model.attend("golden", qs[i], ks[i], vs[i]).out;
  }
  // Each caller with the team size of the sequential calls: the last bits
  // can depend on it (docs/decisions.md, "Threads").
  const int team = at::get_num_threads();
  std::vector<std::thread> th;
  for (int t = 0; t < 4; ++t)
    th.emplace_back([&, t] {
      at::set_num_threads(team);
      for (int i = t; i < 8; i += 4) got[i] = model.attend("golden", qs[i], ks[i], vs[i]).out;
    });
  for (auto& t : th) t.join();
  for (int i = 0; i < 8; ++i) CHECK_CLOSE_T(got[i], expect[i], 0.0);
}

TEST_CASE("runtime: wrong shapes, dtypes and layer names are refused with one sentence") {
  auto j = load_json("operator.json");
  asap::Artifact art;
  art.layers.push_back(golden_layer(j["cases"][0]));
  const asap::CompiledModel model(art, "x.h5");
  auto q = at::randn({1, 1, 8, 4});
  CHECK_THROWS_WITH_AS(model.attend("nope", q, q, q),
                       doctest::Contains("artifact 'x.h5' has no layer 'nope' (it has 'golden')"), asap::Error);
  CHECK_THROWS_WITH_AS(model.attend("golden", at::randn({1, 2, 8, 4}), q, q),
                       doctest::Contains("layer 'golden': q must be [B, 1, n, 4], found [1, 2, 8, 4]"), asap::Error);
  CHECK_THROWS_WITH_AS(model.attend("golden", q.to(at::kInt), q.to(at::kInt), q.to(at::kInt)),
                       doctest::Contains("must be float32 or float64"), asap::Error);
  CHECK_THROWS_WITH_AS(model.forward("golden", at::randn({1, 8, 4})),
                       doctest::Contains("carries no projection weights"), asap::Error);
}

TEST_CASE("runtime: float16 and bfloat16 inputs run in float32 and come back in their dtype") {
  auto j = load_json("operator.json");
  asap::Artifact art;
  art.layers.push_back(golden_layer(j["cases"][0]));
  const asap::CompiledModel model(art, "x.h5");
  at::manual_seed(9);
  auto q = at::randn({2, 1, 8, 4}), k = at::randn({2, 1, 8, 4}), v = at::randn({2, 1, 8, 4});
  for (auto dt : {at::kHalf, at::kBFloat16}) {
    const std::string dtype = c10::toString(dt);
    CAPTURE(dtype);
    auto qh = q.to(dt), kh = k.to(dt), vh = v.to(dt);
    asap::RunOptions ro;
    ro.return_attention = true;
    auto r = model.attend("golden", qh, kh, vh, at::Tensor(), ro);
    CHECK((r.out.scalar_type() == dt));
    CHECK((r.attention.scalar_type() == dt));
    auto want = model.attend("golden", qh.to(at::kFloat), kh.to(at::kFloat), vh.to(at::kFloat), at::Tensor(), ro);
    CHECK(at::equal(r.out, want.out.to(dt)));
    const auto& L = art.layers[0];
    auto t =
        asap::run_teacher(qh, kh, vh, at::Tensor(), L.spec.score_scale, L.spec.T, asap::convention_of(L.spec), true);
    CHECK((t.O.scalar_type() == dt));
    auto tw = asap::run_teacher(qh.to(at::kFloat), kh.to(at::kFloat), vh.to(at::kFloat), at::Tensor(),
                                L.spec.score_scale, L.spec.T, asap::convention_of(L.spec), true);
    CHECK(at::equal(t.O, tw.O.to(dt)));
  }
}

TEST_CASE("runtime: a NaN or infinity in q, k or v makes that head's output NaN, other heads are untouched") {
  auto j = load_json("operator.json");
  asap::Artifact art;
  art.layers.push_back(golden_layer(j["cases"][0]));
  art.layers[0].spec.heads = 2;              // one map pooled over two heads
  asap::CompiledLayer sink = art.layers[0];  // the same layer stored as plain Sinkhorn T' = 3
  sink.spec.name = "sink";
  sink.kind = asap::OperatorKind::kSinkhorn;
  sink.sinkhorn_steps = 3;
  art.layers.push_back(sink);
  const asap::CompiledModel model(art, "x.h5");
  at::manual_seed(5);
  // Three examples of two heads each: the bad value sits in head 1 of
  // example 1 only (the fused path flags heads b-major: b * H + h).
  auto q = at::randn({3, 2, 8, 4}), k = at::randn({3, 2, 8, 4}), v = at::randn({3, 2, 8, 4});
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const std::string layer : {"golden", "sink"}) {
    for (int which = 0; which < 3; ++which) {
      for (float bad : {nan, inf, -inf}) {
        CAPTURE(layer);
        CAPTURE(which);
        CAPTURE(bad);
        auto qb = q.clone(), kb = k.clone(), vb = v.clone();
        (which == 0 ? qb : which == 1 ? kb : vb)[1][1][3][2] = bad;
        asap::RunOptions ro;
        ro.return_attention = true;
        auto clean = model.attend(layer, q, k, v, at::Tensor(), ro);
        auto r = model.attend(layer, qb, kb, vb, at::Tensor(), ro);
        CHECK(r.out[1][1].isnan().all().item<bool>());
        CHECK(r.attention[1][1].isnan().all().item<bool>());
        CHECK(at::equal(r.out[1][0], clean.out[1][0]));
        CHECK(at::equal(r.attention[1][0], clean.attention[1][0]));
        for (int e : {0, 2}) {
          CHECK(at::equal(r.out[e], clean.out[e]));
          CHECK(at::equal(r.attention[e], clean.attention[e]));
        }
      }
    }
  }
}
