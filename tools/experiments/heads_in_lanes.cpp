// Sinkhorn attention with one head per SIMD lane: a prototype, not part of
// asapc. The fused kernels (src/lib/fast) run one head at a time with the
// keys (or rows) in the lanes; at n = 17-32 a head's rows are two to four
// vectors and a lone column, so a good part of a call is horizontal
// reductions, scalar tails, packing and per-head set-up. Here W heads share
// every vector instead (W = 8 float32 lanes on AVX2, 16 on AVX-512, 4
// without either): q, k and v are transposed into [token][feature][head]
// once, and the score GEMM, every log-sum-exp pass and the output GEMM are
// plain vector loops with no reduction across lanes and no tail at any n.
//
//   tools/experiments/heads_in_lanes.sh        (builds this file and runs it)
//   heads_in_lanes N D HEADS REPS T1,T2,...
//
// For each T' it prints the median time of one call over HEADS heads
// (Sinkhorn T' = T' from g' = 0, starting with a row pass, as the teacher's
// loop; the last pass fused with the output: E once, scaled, times V), and
// the largest |difference| of the output from a float64 loop of the same
// convention; last, whether a head with an infinite input comes out all NaN
// while the others do not change. Unmasked, float32, d = dv a multiple of 8 and of W, HEADS a
// multiple of W. One thread.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

#if defined(__AVX512F__)
constexpr int W = 16;
#define W_IS_8 0
#elif defined(__AVX2__)
constexpr int W = 8;
#define W_IS_8 1
#else
constexpr int W = 4;  // the baseline's 16-byte vectors
#define W_IS_8 0
#endif
typedef float V __attribute__((vector_size(4 * W)));
typedef int VI __attribute__((vector_size(4 * W)));

inline V splat(float x) { return V{} + x; }
inline V vmax(V a, V b) { return a > b ? a : b; }

// exp(x): 2^(x log2 e) by rounding to an integer k and a degree-6
// polynomial of 2^r, r in [-1/2, 1/2]; 0 below -87 (and for -inf).
inline V vexp(V x) {
  const V t = vmax(x * 1.44269504088896341f, splat(-126.f));
  const V k = __builtin_convertvector(__builtin_convertvector(t + (t > 0 ? splat(0.5f) : splat(-0.5f)), VI), V);
  const V r = (t - k) * 0.693147180559945309f;
  V p = splat(1.f / 720);
  p = p * r + 1.f / 120;
  p = p * r + 1.f / 24;
  p = p * r + 1.f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const VI e = (__builtin_convertvector(k, VI) + 127) << 23;
  V s;
  std::memcpy(&s, &e, sizeof s);
  return x < -87.f ? V{} : p * s;
}

// log(x) for positive normal x (Cephes logf polynomial, as the fused kernels').
inline V vlog(V x) {
  VI bits;
  std::memcpy(&bits, &x, sizeof bits);
  V e = __builtin_convertvector((bits >> 23) & 0xff, V) - 126.f;
  bits = (bits & 0x807fffff) | 0x3f000000;
  std::memcpy(&x, &bits, sizeof x);
  const auto small = x < 0.707106781186547524f;
  e = small ? e - 1.f : e;
  x = small ? x + x - 1.f : x - 1.f;
  const V z = x * x;
  V y = splat(7.0376836292E-2f);
  y = y * x - 1.1514610310E-1f;
  y = y * x + 1.1676998740E-1f;
  y = y * x - 1.2420140846E-1f;
  y = y * x + 1.4249322787E-1f;
  y = y * x - 1.6668057665E-1f;
  y = y * x + 2.0000714765E-1f;
  y = y * x - 2.4999993993E-1f;
  y = y * x + 3.3333331174E-1f;
  y = y * x * z;
  y += e * -2.12194440e-4f;
  y -= 0.5f * z;
  return x + y + e * 0.693359375f;
}

// The transpose of W vectors in place: r[c][h] becomes r[h][c]. AVX2: the
// usual three rounds of two-source shuffles; otherwise through memory.
inline void transpose(V* r) {
#if W_IS_8
  V t[8], u[8];
  for (int p = 0; p < 8; p += 2) {
    t[p] = __builtin_shufflevector(r[p], r[p + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[p + 1] = __builtin_shufflevector(r[p], r[p + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int p = 0; p < 8; p += 4)
    for (int h = 0; h < 2; ++h) {
      u[p + h * 2] = __builtin_shufflevector(t[p + h], t[p + h + 2], 0, 1, 8, 9, 4, 5, 12, 13);
      u[p + h * 2 + 1] = __builtin_shufflevector(t[p + h], t[p + h + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    }
  for (int c = 0; c < 4; ++c) {
    r[c] = __builtin_shufflevector(u[c], u[c + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    r[c + 4] = __builtin_shufflevector(u[c], u[c + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
#else
  alignas(64) float t[W][W];
  for (int c = 0; c < W; ++c) std::memcpy(t[c], &r[c], sizeof(V));
  for (int c = 0; c < W; ++c)
    for (int h = 0; h < W; ++h) r[c][h] = t[h][c];
#endif
}

// dst[c][h] = src[h * stride + c] for h, c < W (lane h of vector c).
inline void transpose_in(const float* src, int64_t stride, V* dst) {
  V r[W];
  for (int h = 0; h < W; ++h) std::memcpy(&r[h], src + h * stride, sizeof(V));
  transpose(r);
  for (int c = 0; c < W; ++c) dst[c] = r[c];
}
// dst[h * stride + c] = src[c][h].
inline void transpose_out(const V* src, float* dst, int64_t stride) {
  V r[W];
  for (int c = 0; c < W; ++c) r[c] = src[c];
  transpose(r);
  for (int h = 0; h < W; ++h) std::memcpy(dst + h * stride, &r[h], sizeof(V));
}

struct Work {
  int n, d;
  std::vector<V> Q, K, Vv, S, f, g, m, s, O, sc;  // sc: the output rows' scale
  Work(int n_, int d_)
      : n(n_), d(d_), Q(n_ * d_), K(n_ * d_), Vv(n_ * d_), S(n_ * n_), f(n_), g(n_), m(n_), s(n_), O(n_ * d_), sc(n_) {}
};

template <int NI, int NJ>
inline void score_tile(Work& w, int i0, int j0, float s_eps) {
  const int n = w.n, d = w.d;
  V a[NI][NJ] = {};
  for (int c = 0; c < d; ++c) {
    V x[NI], y[NJ];
    for (int u = 0; u < NI; ++u) x[u] = w.Q[(i0 + u) * d + c];
    for (int t = 0; t < NJ; ++t) y[t] = w.K[(j0 + t) * d + c];
    for (int u = 0; u < NI; ++u)
      for (int t = 0; t < NJ; ++t) a[u][t] += x[u] * y[t];
  }
  for (int u = 0; u < NI; ++u)
    for (int t = 0; t < NJ; ++t) w.S[(i0 + u) * n + j0 + t] = a[u][t] * s_eps;
}

// O's rows i0.. (NI of them), outputs c0..c0+7: sc_i sum_j E_ij V_j.
template <int NI>
inline void out_tile(Work& w, int i0, int c0) {
  const int n = w.n, d = w.d;
  V o[NI][8] = {};
  for (int j = 0; j < n; ++j) {
    const V* vj = &w.Vv[j * d + c0];
    for (int u = 0; u < NI; ++u) {
      const V e = w.S[(i0 + u) * n + j];
      for (int t = 0; t < 8; ++t) o[u][t] += e * vj[t];
    }
  }
  for (int u = 0; u < NI; ++u)
    for (int t = 0; t < 8; ++t) w.O[(i0 + u) * d + c0 + t] = o[u][t] * w.sc[i0 + u];
}

// One group of W heads: q, k, v at [head][token][feature], out the same.
// A head whose q, k or v holds an inf or a NaN gets NaN for its whole output,
// as asapc's runtime gives it (the check is part of what a call costs).
void group(Work& w, const float* q, const float* k, const float* v, float* out, float s_eps, int T) {
  const int n = w.n, d = w.d;
  const int64_t hs = static_cast<int64_t>(n) * d;  // one head's stride
  V bad{};
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < d; c += W) {
      transpose_in(q + i * d + c, hs, &w.Q[i * d + c]);
      transpose_in(k + i * d + c, hs, &w.K[i * d + c]);
      transpose_in(v + i * d + c, hs, &w.Vv[i * d + c]);
      for (int t = 0; t < W; ++t) {
        const V a = w.Q[i * d + c + t], b = w.K[i * d + c + t], e = w.Vv[i * d + c + t];
        bad += (a - a) + (b - b) + (e - e);  // NaN where anything is inf or NaN
      }
    }
  // Scores S'_ij = s_eps <q_i, k_j>: two rows and four keys at a time (six
  // loads for eight multiply-adds), the odd row and keys on their own.
  for (int i = 0; i < n; i += 2) {
    int j = 0;
    if (i + 1 < n) {
      for (; j + 4 <= n; j += 4) score_tile<2, 4>(w, i, j, s_eps);
      for (; j < n; ++j) score_tile<2, 1>(w, i, j, s_eps);
    } else {
      for (; j + 4 <= n; j += 4) score_tile<1, 4>(w, i, j, s_eps);
      for (; j < n; ++j) score_tile<1, 1>(w, i, j, s_eps);
    }
  }
  const float la = -std::log(static_cast<float>(n));
  for (int j = 0; j < n; ++j) w.g[j] = V{};
  V* S = w.S.data();
  for (int t = 1; t <= T; ++t) {
    const bool fin = t == T;
    if (t % 2 == 1) {  // row pass: f_i = log a - LSE_j(S_ij + g_j)
      for (int i = 0; i < n; ++i) {
        V* r = S + i * n;
        V mx = splat(-INFINITY);
        for (int j = 0; j < n; ++j) mx = vmax(mx, r[j] + w.g[j]);
        V sm{};
        if (fin) {
          for (int j = 0; j < n; ++j) {
            const V e = vexp(r[j] + w.g[j] - mx);
            r[j] = e;  // E in place of the scores (the last pass)
            sm += e;
          }
          w.sc[i] = 1.f / sm;  // the rows of n P sum to 1: O_i = (E V)_i / sum_j E_ij
        } else {
          for (int j = 0; j < n; ++j) sm += vexp(r[j] + w.g[j] - mx);
          w.f[i] = la - mx - vlog(sm);
        }
      }
    } else {  // column pass: g_j = log b - LSE_i(S_ij + f_i)
      for (int j = 0; j < n; ++j) w.m[j] = splat(-INFINITY), w.s[j] = V{};
      for (int i = 0; i < n; ++i) {
        const V fi = w.f[i];
        const V* r = S + i * n;
        for (int j = 0; j < n; ++j) w.m[j] = vmax(w.m[j], r[j] + fi);
      }
      for (int i = 0; i < n; ++i) {
        const V fi = w.f[i];
        V* r = S + i * n;
        if (fin) {
          for (int j = 0; j < n; ++j) {
            const V e = vexp(r[j] + fi - w.m[j]);
            r[j] = e;  // E in place of the scores (the last pass)
            w.s[j] += e;
          }
        } else {
          for (int j = 0; j < n; ++j) w.s[j] += vexp(r[j] + fi - w.m[j]);
        }
      }
      if (fin) {
        // n P_ij = E_ij / s_j (each column's mass 1/n): scale V's rows, then O = E V'.
        for (int j = 0; j < n; ++j) {
          const V inv = 1.f / w.s[j];
          for (int c = 0; c < d; ++c) w.Vv[j * d + c] *= inv;
        }
        for (int i = 0; i < n; ++i) w.sc[i] = splat(1.f);
      } else {
        for (int j = 0; j < n; ++j) w.g[j] = la - w.m[j] - vlog(w.s[j]);
      }
    }
  }
  // O = diag(sc) E V: two rows and eight outputs at a time.
  for (int i = 0; i < n; i += 2)
    for (int c = 0; c < d; c += 8) i + 1 < n ? out_tile<2>(w, i, c) : out_tile<1>(w, i, c);
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < d; c += W) transpose_out(&w.O[i * d + c], out + i * d + c, hs);
  for (int h = 0; h < W; ++h)
    if (bad[h] != 0.f) std::fill(out + h * hs, out + (h + 1) * hs, NAN);  // NaN != 0 too
}

// The same loop in float64, one head: the reference.
void reference(int n, int d, const float* q, const float* k, const float* v, double s_eps, int T, double* out) {
  std::vector<double> S(n * n), f(n, 0.0), g(n, 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      double a = 0;
      for (int c = 0; c < d; ++c) a += static_cast<double>(q[i * d + c]) * k[j * d + c];
      S[i * n + j] = a * s_eps;
    }
  const double la = -std::log(static_cast<double>(n));
  for (int t = 1; t <= T; ++t) {
    if (t % 2 == 1) {
      for (int i = 0; i < n; ++i) {
        double m = -INFINITY, s = 0;
        for (int j = 0; j < n; ++j) m = std::max(m, S[i * n + j] + g[j]);
        for (int j = 0; j < n; ++j) s += std::exp(S[i * n + j] + g[j] - m);
        f[i] = la - m - std::log(s);
      }
    } else {
      for (int j = 0; j < n; ++j) {
        double m = -INFINITY, s = 0;
        for (int i = 0; i < n; ++i) m = std::max(m, S[i * n + j] + f[i]);
        for (int i = 0; i < n; ++i) s += std::exp(S[i * n + j] + f[i] - m);
        g[j] = la - m - std::log(s);
      }
    }
  }
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < d; ++c) {
      double o = 0;
      for (int j = 0; j < n; ++j) o += n * std::exp(S[i * n + j] + f[i] + g[j]) * v[j * d + c];
      out[i * d + c] = o;
    }
}

int parse(const char* s, const char* what) {
  char* end = nullptr;
  const long x = std::strtol(s, &end, 10);
  if (!end || *end || x <= 0 || x > 1 << 20) {
    std::fprintf(stderr, "heads_in_lanes: expected %s as a positive integer, found '%s'\n", what, s);
    std::exit(2);
  }
  return static_cast<int>(x);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: heads_in_lanes N D HEADS REPS T1,T2,...\n");
    return 2;
  }
  const int n = parse(argv[1], "N"), d = parse(argv[2], "D"), H = parse(argv[3], "HEADS"),
            reps = parse(argv[4], "REPS");
  const int dw = std::max(W, 8);  // the output GEMM's blocks are 8 wide
  if (d % dw != 0 || H % W != 0) {
    std::fprintf(stderr, "heads_in_lanes: expected D a multiple of %d and HEADS of %d, found %d and %d\n", dw, W, d, H);
    return 2;
  }
  std::vector<int> Ts;
  for (const char* p = argv[5]; *p;) {
    char* end = nullptr;
    const long t = std::strtol(p, &end, 10);
    if (end == p || t <= 0 || t > 64) {
      std::fprintf(stderr, "heads_in_lanes: expected T' values from 1 to 64, found '%s'\n", argv[5]);
      return 2;
    }
    Ts.push_back(static_cast<int>(t));
    p = *end == ',' ? end + 1 : end;
  }
  // Inputs like a trained head's: scores of a few units (scale 1/sqrt(d), eps = 1).
  std::mt19937 rng(7);
  std::normal_distribution<float> N01(0.f, 1.f);
  const int64_t sz = static_cast<int64_t>(H) * n * d;
  std::vector<float> q(sz), k(sz), v(sz), out(sz);
  for (auto* x : {&q, &k, &v})
    for (auto& e : *x) e = N01(rng);
  const float s_eps = 1.f / std::sqrt(static_cast<float>(d));
  Work w(n, d);
  std::vector<double> ref(static_cast<size_t>(n) * d);
  std::printf("W = %d heads per vector, n = %d, d = dv = %d, %d heads, one thread\n", W, n, d, H);
  for (int T : Ts) {
    auto call = [&] {
      for (int g0 = 0; g0 < H; g0 += W) {
        const int64_t off = static_cast<int64_t>(g0) * n * d;
        group(w, q.data() + off, k.data() + off, v.data() + off, out.data() + off, s_eps, T);
      }
    };
    call();
    double err = 0;
    for (int h = 0; h < H; h += std::max(1, H / 8)) {
      const int64_t off = static_cast<int64_t>(h) * n * d;
      reference(n, d, q.data() + off, k.data() + off, v.data() + off, s_eps, T, ref.data());
      for (int e = 0; e < n * d; ++e) err = std::max(err, std::abs(ref[e] - out[off + e]));
    }
    std::vector<double> times;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      call();
      times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    std::nth_element(times.begin(), times.begin() + reps / 2, times.end());
    std::printf("T'=%d median %.2f us a call, max |out - float64 reference| %.2e\n", T, times[reps / 2], err);
  }
  // An infinity in head 1's values: head 1's output all NaN (without the check only
  // one output column would be infinite), head 0's unchanged.
  std::vector<float> before(out.begin(), out.begin() + n * d);
  v[static_cast<size_t>(n) * d + 3] = INFINITY;
  group(w, q.data(), k.data(), v.data(), out.data(), s_eps, Ts.back());
  bool nan1 = true, same0 = true;
  for (int e = 0; e < n * d; ++e) {
    nan1 = nan1 && std::isnan(out[n * d + e]);
    same0 = same0 && out[e] == before[e];
  }
  std::printf("non-finite input: its head's output all NaN %s, the other heads unchanged %s\n", nan1 ? "yes" : "no",
              same0 ? "yes" : "no");
  return 0;
}
