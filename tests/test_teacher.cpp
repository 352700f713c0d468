// The finite Sinkhorn teacher against the independent float64 golden cases
// (asap-math.md sections 1-3) and the closure properties of section 5.
#include <ATen/ATen.h>

#include "asap/error.h"
#include "asap/runtime.h"
#include "asap/teacher.h"
#include "test_util.h"

using asap_test::load_json;
using asap_test::tensor_from_json;

namespace {
at::Tensor bh(const at::Tensor& t) { return t.unsqueeze(0).unsqueeze(0); }  // [n,d] -> [1,1,n,d]
}  // namespace

TEST_CASE("teacher matches golden float64 cases to 1e-10") {
  auto j = load_json("teacher.json");
  int count = 0;
  for (const auto& c : j["cases"]) {
    const int T = c["T"].get<int>();
    CAPTURE(T);
    CAPTURE(c["n"].get<int>());
    auto Q = tensor_from_json(c["Q"]), K = tensor_from_json(c["K"]), V = tensor_from_json(c["V"]);
    auto mask = tensor_from_json(c["key_mask"]).gt(0.5).unsqueeze(0);
    asap::Convention conv;
    conv.eps = c["eps"].get<double>();
    conv.drop_padded_queries = c["drop_padded_queries"].get<bool>();
    auto r = asap::run_teacher(bh(Q), bh(K), bh(V), mask, c["score_scale"].get<double>(), T, conv);
    CHECK_CLOSE_T(r.A[0][0], tensor_from_json(c["A"]), 1e-10);
    CHECK_CLOSE_T(r.O[0][0], tensor_from_json(c["O"]), 1e-10);
    CHECK_CLOSE_T(r.f[0][0], tensor_from_json(c["f_final"]), 1e-10);
    CHECK_CLOSE_T(r.g[0][0], tensor_from_json(c["g_final"]), 1e-10);
    if (T >= 2) {
      CHECK_CLOSE_T(r.f_star[0][0], tensor_from_json(c["f_star"]), 1e-10);
      CHECK_CLOSE_T(r.phi_bar_star[0][0], tensor_from_json(c["phi_bar_star"]), 1e-10);
    } else {
      CHECK_FALSE(r.f_star.defined());
    }
    ++count;
  }
  CHECK(count == 8);
}

TEST_CASE("teacher: closures give exact marginals and the ending side follows T's parity") {
  at::manual_seed(3);
  const int64_t B = 2, H = 3, n = 9, d = 5;
  auto q = at::randn({B, H, n, d}, at::kDouble), k = at::randn({B, H, n, d}, at::kDouble);
  auto mask = at::ones({B, n}, at::kBool);
  mask[1].slice(0, 6).fill_(false);  // second sequence has 6 tokens
  asap::Convention conv;
  for (int T : {2, 3, 6, 7}) {
    CAPTURE(T);
    auto r = asap::run_teacher(q, k, at::Tensor(), mask, 0.4, T, conv);
    auto colsum = r.A.sum(-2);  // [B,H,n]
    auto rowsum = r.A.sum(-1);
    if (T % 2 == 0) {
      // Column-ending: active columns sum to 1, padded columns to 0.
      CHECK_CLOSE_T(colsum[0], at::ones({H, n}, at::kDouble), 1e-12);
      CHECK_CLOSE_T(colsum[1].slice(1, 0, 6), at::ones({H, 6}, at::kDouble), 1e-12);
      CHECK_CLOSE_T(colsum[1].slice(1, 6), at::zeros({H, 3}, at::kDouble), 0.0);
    } else {
      CHECK_CLOSE_T(rowsum, at::ones({B, H, n}, at::kDouble), 1e-12);
    }
  }
}

TEST_CASE("teacher: plan is invariant to shifting f by a constant") {
  at::manual_seed(4);
  auto S = at::randn({1, 2, 7, 7}, at::kDouble);
  auto m = asap::log_marginals(at::Tensor(), 1, 7, false, at::kDouble, at::kCPU);
  auto f = at::randn({1, 2, 7}, at::kDouble);
  asap::Convention conv;
  auto g1 = asap::col_closure(S, f, m, 1.0);
  auto g2 = asap::col_closure(S, f + 2.5, m, 1.0);
  CHECK_CLOSE_T(asap::plan_attention(S, f, g1, conv), asap::plan_attention(S, f + 2.5, g2, conv), 1e-12);
}

TEST_CASE("teacher: refuses T < 1 and a mask of the wrong shape") {
  auto q = at::randn({1, 1, 4, 2});
  CHECK_THROWS_WITH_AS(asap::run_teacher(q, q, at::Tensor(), at::Tensor(), 1.0, 0, {}),
                       doctest::Contains("Sinkhorn budget T must be at least 1, found 0"), asap::Error);
  CHECK_THROWS_WITH_AS(asap::run_teacher(q, q, at::Tensor(), at::ones({1, 5}, at::kBool), 1.0, 2, {}),
                       doctest::Contains("key-padding mask: expected shape [1, 4], found [1, 5]"), asap::Error);
  // A sequence without a token, in a bool mask and in a 0/1 float one, on the
  // fused path (float32 on the CPU) and the reference path.
  auto q2 = at::randn({2, 1, 4, 2});
  auto none_second = at::ones({2, 4}, at::kBool);
  none_second[1].fill_(false);
  for (const auto& m : {none_second, none_second.to(at::kFloat)}) {
    CAPTURE(m.scalar_type());
    CHECK_THROWS_WITH_AS(asap::run_teacher(q2, q2, at::Tensor(), m, 1.0, 2, {}),
                         doctest::Contains("key-padding mask: every sequence needs at least one token"), asap::Error);
    CHECK_THROWS_WITH_AS(asap::run_teacher_reference(q2, q2, at::Tensor(), m, 1.0, 2, {}, false),
                         doctest::Contains("key-padding mask: every sequence needs at least one token"), asap::Error);
  }
  none_second[1][3] = true;  // one token is enough
  CHECK(asap::run_teacher(q2, q2, q2, none_second, 1.0, 2, {}).O.isfinite().all().item<bool>());
}
