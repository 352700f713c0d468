// Sinkhorn passes in the log domain against the scaling domain, on the same
// scores: a prototype, not part of asapc. The log-domain loop is what every
// fused operator runs today (a pass is n^2 exponentials); the scaling domain
// takes K = exp(S - rowmax) once and then runs each pass as a matrix-vector
// product (n^2 multiply-adds, no exponential). Both loops are written the
// same way here (plain loops, vectorised by the compiler with libmvec's
// exponential), so their ratio is the point, not their absolute times.
//
//   tools/experiments/scaling_domain.sh     (builds this file and runs it)
//   scaling_domain N D HEADS T SCORE_STD REPS
//
// Prints per variant the median time of the T passes over all heads, the
// scaling domain's split into its exponential sweep and its passes (the
// score GEMM and the output GEMM are left out: they are the same in both),
// their ratio, the largest |difference| of the two plans (rows summing to 1),
// and the dynamic range of the scores with the verdict of the range check
// that a fused kernel would make before taking the scaling domain.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

struct Head {
  std::vector<float> S;  // n x n scores (already scaled)
};

// Log domain: f_i = log a - LSE_j(S_ij + g_j), g_j = log b - LSE_i(S_ij + f_i),
// starting with a row pass; returns the plan times n.
// tmp and z: scratch of n each (no allocation in the timed loops).
void log_domain(int n, int T, const float* S, float* f, float* g, float* tmp, float* z, float* P) {
  const float la = -std::log(static_cast<float>(n));
  for (int j = 0; j < n; ++j) g[j] = 0.f, f[j] = 0.f;
  for (int t = 0; t < T; ++t) {
    if (t % 2 == 0) {
      for (int i = 0; i < n; ++i) {
        const float* s = S + i * n;
        float m = -INFINITY;
        for (int j = 0; j < n; ++j) m = std::max(m, s[j] + g[j]);
        float z = 0.f;
        for (int j = 0; j < n; ++j) z += std::exp(s[j] + g[j] - m);
        f[i] = la - m - std::log(z);
      }
    } else {
      for (int j = 0; j < n; ++j) tmp[j] = -INFINITY;
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) tmp[j] = std::max(tmp[j], S[i * n + j] + f[i]);
      for (int j = 0; j < n; ++j) z[j] = 0.f;
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) z[j] += std::exp(S[i * n + j] + f[i] - tmp[j]);
      for (int j = 0; j < n; ++j) g[j] = la - tmp[j] - std::log(z[j]);
    }
  }
  if (P)
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) P[i * n + j] = n * std::exp(S[i * n + j] + f[i] + g[j]);
}

// Scaling domain: K = exp(S - m_i) once, u_i = a / (K v)_i, v_j = b / (K^T u)_j.
// Returns false when a column of K underflows (the fused kernel's range check:
// then it would run the log domain for that head).
bool scaling_domain(int n, int T, const float* S, float* K, float* u, float* v, float* z, float* P) {
  const float a = 1.f / static_cast<float>(n);
  for (int i = 0; i < n; ++i) {
    const float* s = S + i * n;
    float m = -INFINITY;
    for (int j = 0; j < n; ++j) m = std::max(m, s[j]);
    for (int j = 0; j < n; ++j) K[i * n + j] = std::exp(s[j] - m);
  }
  for (int j = 0; j < n; ++j) v[j] = 1.f, u[j] = 1.f;
  bool ok = true;
  for (int t = 0; t < T; ++t) {
    if (t % 2 == 0) {
      for (int i = 0; i < n; ++i) {
        float z = 0.f;
        for (int j = 0; j < n; ++j) z += K[i * n + j] * v[j];
        u[i] = a / z;
      }
    } else {
      for (int j = 0; j < n; ++j) z[j] = 0.f;
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) z[j] += K[i * n + j] * u[i];
      for (int j = 0; j < n; ++j) {
        ok = ok && z[j] > 1e-30f;
        v[j] = a / z[j];
      }
    }
  }
  if (P)
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) P[i * n + j] = n * u[i] * K[i * n + j] * v[j];
  return ok;
}

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: scaling_domain N D HEADS T SCORE_STD REPS\n");
    return 2;
  }
  const int n = std::atoi(argv[1]), d = std::atoi(argv[2]), H = std::atoi(argv[3]), T = std::atoi(argv[4]);
  const double sd = std::atof(argv[5]);
  const int reps = std::atoi(argv[6]);
  if (n < 1 || d < 1 || H < 1 || T < 1 || !(sd > 0) || reps < 1) {
    std::fprintf(stderr, "scaling_domain: expected positive N D HEADS T SCORE_STD REPS\n");
    return 2;
  }
  std::mt19937 rng(7);
  // q, k with entries of std sqrt(sd) so that q.k / sqrt(d) has std about sd
  std::normal_distribution<float> N01(0.f, static_cast<float>(std::sqrt(sd)));
  std::vector<Head> heads(H);
  float lo = INFINITY, hi = -INFINITY, worst_range = 0.f;
  for (auto& h : heads) {
    std::vector<float> q(n * d), k(n * d);
    for (auto& x : q) x = N01(rng);
    for (auto& x : k) x = N01(rng);
    h.S.resize(n * n);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        float s = 0.f;
        for (int c = 0; c < d; ++c) s += q[i * d + c] * k[j * d + c];
        h.S[i * n + j] = s / std::sqrt(static_cast<float>(d));
      }
    const auto [mn, mx] = std::minmax_element(h.S.begin(), h.S.end());
    lo = std::min(lo, *mn), hi = std::max(hi, *mx), worst_range = std::max(worst_range, *mx - *mn);
  }
  std::vector<float> f(n), g(n), tmp(n), z(n), K(n * n), P1(n * n), P2(n * n);
  float maxdiff = 0.f;
  bool all_ok = true;
  for (auto& h : heads) {
    log_domain(n, T, h.S.data(), f.data(), g.data(), tmp.data(), z.data(), P1.data());
    all_ok = scaling_domain(n, T, h.S.data(), K.data(), f.data(), g.data(), z.data(), P2.data()) && all_ok;
    for (int e = 0; e < n * n; ++e) maxdiff = std::max(maxdiff, std::fabs(P1[e] - P2[e]));
  }
  std::vector<double> tl, ts, t0s;
  volatile float sink = 0.f;
  for (int r = 0; r < reps; ++r) {
    for (int which = 0; which < 3; ++which) {
      const auto t0 = std::chrono::steady_clock::now();
      for (auto& h : heads) {
        if (which == 0)
          log_domain(n, T, h.S.data(), f.data(), g.data(), tmp.data(), z.data(), nullptr);
        else  // which == 2: the exponential sweep alone (no pass)
          scaling_domain(n, which == 1 ? T : 0, h.S.data(), K.data(), f.data(), g.data(), z.data(), nullptr);
        sink = sink + f[0] + K[0];
      }
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      (which == 0 ? tl : which == 1 ? ts : t0s).push_back(dt);
    }
  }
  const double a = median(tl), b = median(ts), b0 = median(t0s);
  std::printf("n=%d d=%d heads=%d T=%d scores in [%.1f, %.1f] (largest range in a head %.1f)\n", n, d, H, T, lo, hi,
              worst_range);
  std::printf("log domain: %.2f us for %d passes over %d heads (%.3f us a pass a head)\n", a * 1e6, T, H,
              a * 1e6 / T / H);
  std::printf("scaling domain: %.2f us (one exp sweep, then %d matrix-vector passes): %.2fx faster\n", b * 1e6, T,
              a / b);
  std::printf("  of which the exp sweep %.2f us and the passes %.3f us a pass a head\n", b0 * 1e6,
              (b - b0) * 1e6 / T / H);
  std::printf(
      "largest |plan difference| %.2e; range check: %s\n", maxdiff,
      all_ok ? "every column of K in range (scaling domain usable)" : "a column of K underflowed (log domain needed)");
  return 0;
}
