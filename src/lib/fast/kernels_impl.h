// Fused kernels, written once with GCC vector extensions and compiled per
// instruction set. Include only from kernels_<isa>.cpp, after defining
//   ASAP_VBYTES   vector width in bytes (16, 32, 64)
//   ASAP_ISA_NS   a namespace name for this copy
//   ASAP_ISA_NAME its display name
//   ASAP_NT_MR, ASAP_NT_NV   gemm_nt micro tile: rows x (vectors of columns)
//   ASAP_NN_MR, ASAP_NN_NV   gemm_nn micro tile
// Everything here has internal linkage and uses no standard-library inline
// functions, so nothing compiled for a wide instruction set is shared with
// (or chosen by the linker for) code that runs on a narrower one.
#ifndef ASAP_VBYTES
#error "define ASAP_VBYTES before including kernels_impl.h"
#endif

#include <cstdint>
#include <type_traits>

#include "fast/kernels.h"

#if defined(__x86_64__) || defined(__i386__)
// Intrinsics are always-inline functions that are never emitted out of line,
// so using them keeps this file free of shareable code.
#include <immintrin.h>
#endif

namespace asap {
namespace fast {
namespace ASAP_ISA_NS {
namespace {

template <class T>
struct Vec;
template <>
struct Vec<float> {
  typedef float V __attribute__((vector_size(ASAP_VBYTES)));
  typedef uint32_t U __attribute__((vector_size(ASAP_VBYTES)));
  typedef uint32_t UE;  // U's element
  static constexpr int W = ASAP_VBYTES / 4;
};
template <>
struct Vec<double> {
  typedef double V __attribute__((vector_size(ASAP_VBYTES)));
  typedef uint64_t U __attribute__((vector_size(ASAP_VBYTES)));
  typedef uint64_t UE;  // U's element
  static constexpr int W = ASAP_VBYTES / 8;
};

#include "fast/simd_prelude.h"  // bits_as, load, store for this copy
// x - 0 is x for every x (signed zeros and NaN included), so this folds to
// one broadcast; V{} + x kept a scalar add (-0 + 0 is +0) before each one,
// in every micro tile of gemm_nt and every row of the passes.
template <class V, class T>
inline V splat(T x) {
  return x - V{};
}
template <class V>
inline V vmax(V a, V b) {
  return a > b ? a : b;
}
template <class V>
inline V vmin(V a, V b) {
  return a < b ? a : b;
}
// Scalar square roots as builtins: std::sqrt is a standard-library inline
// function (see the top of this file), and <cmath> is not included here
// (nor <algorithm>: smin and smax stand in for std::min and std::max).
inline float ssqrt(float a) { return __builtin_sqrtf(a); }
inline double ssqrt(double a) { return __builtin_sqrt(a); }

template <class T>
inline T smax(T a, T b) {
  return a > b ? a : b;
}
template <class T>
inline T smin(T a, T b) {
  return a < b ? a : b;
}

// GCC turns `a > b ? a : b` on vectors into compare + blend unless
// -ffinite-math-only; the instruction sets' min/max have exactly these
// semantics (second operand on NaN), so use them where available.
#if (defined(__x86_64__) || defined(__i386__)) && \
    ASAP_VBYTES == 64  // kernels_avx512.cpp (target macros are not defined under #pragma GCC target)
inline Vec<float>::V vmax(Vec<float>::V a, Vec<float>::V b) {
  return (Vec<float>::V)_mm512_max_ps((__m512)a, (__m512)b);
}
inline Vec<float>::V vmin(Vec<float>::V a, Vec<float>::V b) {
  return (Vec<float>::V)_mm512_min_ps((__m512)a, (__m512)b);
}
inline Vec<double>::V vmax(Vec<double>::V a, Vec<double>::V b) {
  return (Vec<double>::V)_mm512_max_pd((__m512d)a, (__m512d)b);
}
inline Vec<double>::V vmin(Vec<double>::V a, Vec<double>::V b) {
  return (Vec<double>::V)_mm512_min_pd((__m512d)a, (__m512d)b);
}
#elif (defined(__x86_64__) || defined(__i386__)) && ASAP_VBYTES == 32  // kernels_avx2.cpp
inline Vec<float>::V vmax(Vec<float>::V a, Vec<float>::V b) {
  return (Vec<float>::V)_mm256_max_ps((__m256)a, (__m256)b);
}
inline Vec<float>::V vmin(Vec<float>::V a, Vec<float>::V b) {
  return (Vec<float>::V)_mm256_min_ps((__m256)a, (__m256)b);
}
inline Vec<double>::V vmax(Vec<double>::V a, Vec<double>::V b) {
  return (Vec<double>::V)_mm256_max_pd((__m256d)a, (__m256d)b);
}
inline Vec<double>::V vmin(Vec<double>::V a, Vec<double>::V b) {
  return (Vec<double>::V)_mm256_min_pd((__m256d)a, (__m256d)b);
}
#elif (defined(__x86_64__) || defined(__i386__)) && ASAP_VBYTES == 16  // SSE2 is baseline on x86-64
inline Vec<float>::V vmax(Vec<float>::V a, Vec<float>::V b) { return (Vec<float>::V)_mm_max_ps((__m128)a, (__m128)b); }
inline Vec<float>::V vmin(Vec<float>::V a, Vec<float>::V b) { return (Vec<float>::V)_mm_min_ps((__m128)a, (__m128)b); }
inline Vec<double>::V vmax(Vec<double>::V a, Vec<double>::V b) {
  return (Vec<double>::V)_mm_max_pd((__m128d)a, (__m128d)b);
}
inline Vec<double>::V vmin(Vec<double>::V a, Vec<double>::V b) {
  return (Vec<double>::V)_mm_min_pd((__m128d)a, (__m128d)b);
}
#endif

// Square root lane by lane (the instruction sets' own where available).
#if (defined(__x86_64__) || defined(__i386__)) && ASAP_VBYTES == 64
inline Vec<float>::V vsqrt(Vec<float>::V a) { return (Vec<float>::V)_mm512_sqrt_ps((__m512)a); }
inline Vec<double>::V vsqrt(Vec<double>::V a) { return (Vec<double>::V)_mm512_sqrt_pd((__m512d)a); }
#elif (defined(__x86_64__) || defined(__i386__)) && ASAP_VBYTES == 32
inline Vec<float>::V vsqrt(Vec<float>::V a) { return (Vec<float>::V)_mm256_sqrt_ps((__m256)a); }
inline Vec<double>::V vsqrt(Vec<double>::V a) { return (Vec<double>::V)_mm256_sqrt_pd((__m256d)a); }
#elif (defined(__x86_64__) || defined(__i386__)) && ASAP_VBYTES == 16
inline Vec<float>::V vsqrt(Vec<float>::V a) { return (Vec<float>::V)_mm_sqrt_ps((__m128)a); }
inline Vec<double>::V vsqrt(Vec<double>::V a) { return (Vec<double>::V)_mm_sqrt_pd((__m128d)a); }
#else
template <class V>
inline V vsqrt(V a) {
  for (int l = 0; l < static_cast<int>(sizeof(V) / sizeof(a[0])); ++l) a[l] = __builtin_sqrt(a[l]);
  return a;
}
#endif

template <class T>
constexpr T neg_inf() {
  return -__builtin_huge_val();
}

// Exponentials: Cody-Waite range reduction x = n ln2 + r, |r| <= ln2/2, a
// polynomial for exp(r) and 2^n assembled in the exponent bits via the
// "1.5 * 2^p" rounding trick (no float->int conversion, so it vectorises on
// every instruction set). Inputs are clamped to the normal range: -inf gives
// about the smallest normal number, which callers only ever multiply by 0 or add
// next to a term equal to 1. Float: a degree-5 polynomial in Horner form,
// fitted for relative error on |r| <= ln2/2 (iteratively reweighted least
// squares towards the minimax fit, exp(0) = 1 kept exact): 1.6e-7 relative
// over [-87, 88] with float32 rounding, against 8.3e-8 for Cephes' expf
// (1 + r + r^2 p(r), p of degree 5), whose three more operations per vector
// were 15-20% of a log-sum-exp pass (docs/performance.md, "A shorter
// exponential"). Double: Taylor to degree 13, ~1 ulp on |r| <= ln2/2.
//
// The float clamp is -87.3365, not -126 ln 2 = -87.33654475: there the
// reduced argument rounds to r = -3.1e-6, p(r) < 1, and every clamped input
// (-inf, and every plan entry far below its maximum) gave 1.1754907e-38,
// a subnormal just under FLT_MIN. Each of them cost a microcode assist in
// the sums and products it entered: at n = 17 on 2 threads the teacher
// T = 6 takes 11% and the 4-pass operators about 9% less time since the clamp
// moved (docs/performance.md, "Subnormal exponentials"). From -87.3365,
// r >= 0 and the result is at least FLT_MIN (tests/test_fast.cpp checks
// every input from -inf up).
template <class V, class U>
inline V exp_f32(V x) {
  x = vmin(x, V{} + 88.3762626647949f);
  x = vmax(x, V{} + -87.3365f);
  const V shifter = V{} + 12582912.0f;  // 1.5 * 2^23
  const V t = x * 1.44269504088896341f + shifter;
  const V n = t - shifter;
  V r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  V p = V{} + 8.2903146784e-3f;
  p = p * r + 4.1897929697e-2f;
  p = p * r + 1.6667636198e-1f;
  p = p * r + 4.9999149528e-1f;
  p = p * r + 9.9999970719e-1f;
  p = p * r + 1.0f;
  const U e = (bits_as<U>(t) << 23) + (127u << 23);
  return p * bits_as<V>(e);
}

template <class V, class U>
inline V exp_f64(V x) {
  x = vmin(x, V{} + 709.0);
  x = vmax(x, V{} + -708.0);
  const V shifter = V{} + 6755399441055744.0;  // 1.5 * 2^52
  const V t = x * 1.4426950408889634074 + shifter;
  const V n = t - shifter;
  V r = x - n * 6.93145751953125E-1;
  r = r - n * 1.42860682030941723212E-6;
  V p = V{} + 1.0 / 6227020800.0;  // 1/13!
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  const V y = p * (r * r) + r + 1.0;
  const U e = (bits_as<U>(t) << 52) + (uint64_t(1023) << 52);
  return y * bits_as<V>(e);
}

// Scalar and vector exponentials of either precision.
inline float sexp(float x) { return exp_f32<float, uint32_t>(x); }
inline double sexp(double x) { return exp_f64<double, uint64_t>(x); }
inline Vec<float>::V vexp_v(Vec<float>::V x) { return exp_f32<Vec<float>::V, Vec<float>::U>(x); }
inline Vec<double>::V vexp_v(Vec<double>::V x) { return exp_f64<Vec<double>::V, Vec<double>::U>(x); }
inline float slog(float x) { return __builtin_logf(x); }
inline double slog(double x) { return __builtin_log(x); }

// Whether any lane of a comparison result (0 or all ones per lane) is set:
// halves ORed together, log2(W) steps.
template <class M>
inline bool any_lane(M m) {
  constexpr int W = sizeof(M) / sizeof(m[0]);
  if constexpr (W == 16) {
    return any_lane(__builtin_shufflevector(m, m, 0, 1, 2, 3, 4, 5, 6, 7) |
                    __builtin_shufflevector(m, m, 8, 9, 10, 11, 12, 13, 14, 15));
  } else if constexpr (W == 8) {
    return any_lane(__builtin_shufflevector(m, m, 0, 1, 2, 3) | __builtin_shufflevector(m, m, 4, 5, 6, 7));
  } else if constexpr (W == 4) {
    return any_lane(__builtin_shufflevector(m, m, 0, 1) | __builtin_shufflevector(m, m, 2, 3));
  } else if constexpr (W == 2) {
    return (m[0] | m[1]) != 0;
  } else {
    return m[0] != 0;
  }
}

// log(x) on lanes that are positive normal numbers (Cephes logf polynomial).
inline Vec<float>::V log_normal(Vec<float>::V x) {
  using V = Vec<float>::V;
  using U = Vec<float>::U;
  const U bits = bits_as<U>(x);
  V e = __builtin_convertvector((bits >> 23) & 0xffu, V) - 126.0f;
  x = bits_as<V>((bits & 0x807fffffu) | 0x3f000000u);  // mantissa in [0.5, 1)
  const auto small = x < 0.707106781186547524f;
  e = small ? e - 1.0f : e;
  x = small ? x + x - 1.0f : x - 1.0f;
  const V zz = x * x;
  V y = splat<V>(7.0376836292E-2f);
  y = y * x - 1.1514610310E-1f;
  y = y * x + 1.1676998740E-1f;
  y = y * x - 1.2420140846E-1f;
  y = y * x + 1.4249322787E-1f;
  y = y * x - 1.6668057665E-1f;
  y = y * x + 2.0000714765E-1f;
  y = y * x - 2.4999993993E-1f;
  y = y * x + 3.3333331174E-1f;
  y = y * x * zz;
  y += e * -2.12194440e-4f;
  y -= 0.5f * zz;
  return x + y + e * 0.693359375f;
}
// Whether some lane is 0, subnormal, negative, inf or NaN (libm's log then
// takes the vector lane by lane). A lane is a positive normal number when
// its bits less the smallest normal's lie below the distance to infinity's:
// one compare and an OR across the lanes (checking lane by lane spilled the
// vector and cost a fifth of add_log at n = 17).
inline bool any_special(Vec<float>::V x) {
  using U = Vec<float>::U;
  return any_lane(bits_as<U>(x) - 0x00800000u >= 0x7f000000u);
}

// out[i] += log(z[i]) for i < count: float lanes with the Cephes logf
// polynomial (about 1 ulp on [1, n], where every row sum lies), doubles
// with the libm log. One scalar logf per row was 7% of a pass at n = 17.
inline void add_log(const float* z, float* out, int64_t count) {
  using V = Vec<float>::V;
  constexpr int W = Vec<float>::W;
  int64_t i = 0;
  for (; i + W <= count; i += W) {
    const V x = load<V>(z + i);
    if (any_special(x)) {
      for (int l = 0; l < W; ++l) out[i + l] += slog(z[i + l]);
      continue;
    }
    store(out + i, load<V>(out + i) + log_normal(x));
  }
  for (; i < count; ++i) out[i] += slog(z[i]);
}
inline void add_log(const double* z, double* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) out[i] += slog(z[i]);
}
// add_log's loop with another store. (One loop for both, taking the stores as
// lambdas, ran the n = 17 operators 1-2% slower: build_ab.sh, 7 rounds.)
inline void lse_finish(const float* mx, const float* sm, float log_m, float* out, int64_t count) {
  using V = Vec<float>::V;
  constexpr int W = Vec<float>::W;
  int64_t i = 0;
  for (; i + W <= count; i += W) {
    const V x = load<V>(sm + i);
    if (any_special(x)) {
      for (int l = 0; l < W; ++l) out[i + l] = log_m - mx[i + l] - slog(sm[i + l]);
      continue;
    }
    store(out + i, splat<V>(log_m) - load<V>(mx + i) - log_normal(x));
  }
  for (; i < count; ++i) out[i] = log_m - mx[i] - slog(sm[i]);
}
inline void lse_finish(const double* mx, const double* sm, double log_m, double* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) out[i] = log_m - mx[i] - slog(sm[i]);
}

// Horizontal sum and max by halving (log2 W vector steps instead of W
// dependent scalar ones: at n = 17 the scalar chains were most of a row's
// work). The sum's rounding differs from a left-to-right sum by an ulp or so.
template <class T, class V>
inline T tree_reduce(V v, bool is_max) {
  constexpr int W = sizeof(V) / sizeof(T);
  if constexpr (W == 16) {
    const auto a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
    const auto b = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    return tree_reduce<T>(is_max ? (a > b ? a : b) : a + b, is_max);
  } else if constexpr (W == 8) {
    const auto a = __builtin_shufflevector(v, v, 0, 1, 2, 3);
    const auto b = __builtin_shufflevector(v, v, 4, 5, 6, 7);
    return tree_reduce<T>(is_max ? (a > b ? a : b) : a + b, is_max);
  } else if constexpr (W == 4) {
    const auto a = __builtin_shufflevector(v, v, 0, 1);
    const auto b = __builtin_shufflevector(v, v, 2, 3);
    return tree_reduce<T>(is_max ? (a > b ? a : b) : a + b, is_max);
  } else if constexpr (W == 2) {
    return is_max ? smax<T>(v[0], v[1]) : v[0] + v[1];
  } else {
    return v[0];
  }
}
template <class T>
inline T hsum(typename Vec<T>::V v) {
  return tree_reduce<T>(v, false);
}
template <class T>
inline T hmax(typename Vec<T>::V v) {
  return tree_reduce<T>(v, true);
}

// ---------------------------------------------------------------- GEMMs ---

// Transposes the W x W block held in r[0..W) (row t = r[t]) in place
// (transpose_rows, simd_prelude.h; vpermt2ps with AVX-512).
template <class T>
inline void transpose_block(typename Vec<T>::V* r) {
  transpose_rows<typename Vec<T>::V, typename Vec<T>::U, typename Vec<T>::UE, Vec<T>::W>(r);
}
#if (defined(__x86_64__) || defined(__i386__)) && ASAP_VBYTES == 64
// 16 x 16 floats with AVX-512: four rounds of non-destructive immediate
// shuffles, so the rows and temporaries fit the 32 registers (the vpermt2ps
// rounds need index vectors and overwrite a source; their block spilled).
// After the first two rounds b[4g + c]'s 128-bit lane L holds column 4L + c
// of rows 4g..4g+3; the last two gather output row 4L + c from lane L of
// b[c], b[4 + c], b[8 + c], b[12 + c]. 2-6% off every operator at n = 17,
// d = 64 (docs/performance.md, "The 16 x 16 block with immediate shuffles").
template <>
inline void transpose_block<float>(Vec<float>::V* r) {
  __m512 b[16];
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    const __m512 a0 = (__m512)r[4 * g], a1 = (__m512)r[4 * g + 1], a2 = (__m512)r[4 * g + 2], a3 = (__m512)r[4 * g + 3];
    const __m512 lo01 = _mm512_unpacklo_ps(a0, a1), hi01 = _mm512_unpackhi_ps(a0, a1);
    const __m512 lo23 = _mm512_unpacklo_ps(a2, a3), hi23 = _mm512_unpackhi_ps(a2, a3);
    b[4 * g] = _mm512_shuffle_ps(lo01, lo23, 0x44);
    b[4 * g + 1] = _mm512_shuffle_ps(lo01, lo23, 0xEE);
    b[4 * g + 2] = _mm512_shuffle_ps(hi01, hi23, 0x44);
    b[4 * g + 3] = _mm512_shuffle_ps(hi01, hi23, 0xEE);
  }
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m512 e01 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0x88), o01 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0xDD);
    const __m512 e23 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0x88),
                 o23 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0xDD);
    r[c] = (Vec<float>::V)_mm512_shuffle_f32x4(e01, e23, 0x88);
    r[8 + c] = (Vec<float>::V)_mm512_shuffle_f32x4(e01, e23, 0xDD);
    r[4 + c] = (Vec<float>::V)_mm512_shuffle_f32x4(o01, o23, 0x88);
    r[12 + c] = (Vec<float>::V)_mm512_shuffle_f32x4(o01, o23, 0xDD);
  }
}
#endif

// Shuffle masks of two_row_columns: output t takes lane t of the first row
// into lane 0 and lane t of the second into lane 1.
template <class I, int W>
struct TwoRowMasks {
  I pick[W][W] = {}, iota[W] = {};
  constexpr TwoRowMasks() {
    for (int t = 0; t < W; ++t) {
      iota[t] = static_cast<I>(t);
      for (int l = 0; l < W; ++l) pick[t][l] = static_cast<I>(l == 1 ? W + t : t);
    }
  }
};

// The columns 0..e-1 of a block of rr <= 2 rows (r0, and r1 when rr = 2) as
// vectors: out(t) gets r0[t] in lane 0, r1[t] in lane 1 (rr = 2) and zeros
// elsewhere, one two-source shuffle each. The edge blocks of transpose and
// pack_b (n = 17, 33, 49 leave one row past the last full vector, n = 50
// two), where a W x W transpose in registers mostly moved zeros: the four
// transposes of a 17 x 17 tile cost 5% of a 4-pass call.
template <class T, class Out>
inline void two_row_columns(typename Vec<T>::V r0, typename Vec<T>::V r1, int64_t rr, int64_t e, const Out& out) {
  using V = typename Vec<T>::V;
  using U = typename Vec<T>::U;
  using I = typename Vec<T>::UE;
  constexpr int W = Vec<T>::W;
  static constexpr TwoRowMasks<I, W> kM{};
  const auto keep = load<U>(kM.iota) < (U{} + static_cast<I>(rr));
  if (rr < 2) r1 = V{};
  for (int64_t t = 0; t < e; ++t) {
    const V v = __builtin_shuffle(r0, r1, load<U>(kM.pick[t]));
    out(t, keep ? v : V{});
  }
}

template <class T>
void pack_b(int64_t N, int64_t K, const T* B, int64_t ldb, T alpha, T* out) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W, NR = ASAP_NT_NV * W;
  const int64_t panels = (N + NR - 1) / NR;
  for (int64_t p = 0; p < panels; ++p) {
    T* o = out + p * K * NR;
    const int64_t j0 = p * NR, cols = smin<int64_t>(NR, N - j0);
    // Only the vectors gemm_nt reads are written: columns past N are zero up
    // to the next multiple of the vector width, the rest of a short last
    // panel is never read (a short sequence's panel is mostly padding).
    const int64_t wcols = smin<int64_t>(NR, (cols + W - 1) / W * W);
    // W x W blocks transposed in registers (a quarter of a short head's
    // packing time at n = 64 went to the scalar strided loop below), then
    // the edges: k outer, so that every store is contiguous.
    const int64_t kfull = K / W * W, cfull = cols / W * W;
    for (int64_t k = 0; k < kfull; k += W)
      for (int64_t jj = 0; jj < cfull; jj += W) {
        V r[W];
#pragma GCC unroll 32
        for (int t = 0; t < W; ++t) r[t] = load<V>(B + (j0 + jj + t) * ldb + k);
        transpose_block<T>(r);
#pragma GCC unroll 32
        for (int t = 0; t < W; ++t) store(o + (k + t) * NR + jj, r[t] * alpha);
      }
    // The last partial block of columns over the full blocks of K: the same
    // transpose with zero vectors for the keys past N, so that every panel
    // vector is written by one vector store (a vector store of zeros with
    // scalar stores over it, read at once by gemm_nt, cost a store-forwarding
    // stall per panel row at n = 17).
    if (cols - cfull >= 1 && cols - cfull <= 2) {
      // One or two keys past the full blocks: their rows' vectors shuffled
      // into place (two_row_columns), zeros in the other lanes.
      const T* b0 = B + (j0 + cfull) * ldb;
      for (int64_t k = 0; k < kfull; k += W) {
        const V r1 = cols - cfull == 2 ? load<V>(b0 + ldb + k) : V{};
        two_row_columns<T>(load<V>(b0 + k), r1, cols - cfull, W,
                           [&](int64_t t, V v) { store(o + (k + t) * NR + cfull, v * alpha); });
      }
    } else if (cols > cfull)
      for (int64_t k = 0; k < kfull; k += W) {
        V r[W];
#pragma GCC unroll 32
        for (int t = 0; t < W; ++t) r[t] = cfull + t < cols ? load<V>(B + (j0 + cfull + t) * ldb + k) : V{};
        transpose_block<T>(r);
#pragma GCC unroll 32
        for (int t = 0; t < W; ++t) store(o + (k + t) * NR + cfull, r[t] * alpha);
      }
    // The K edge (d not a multiple of the width), zero past N.
    for (int64_t k = kfull; k < K; ++k) {
      T* ok = o + k * NR;
      const T* bk = B + j0 * ldb + k;
      // (Zeros by vector, then the values over them: a vector assembled on the
      // stack from scalar stores and loaded back stalled on store forwarding.)
      for (int64_t jv = 0; jv < wcols; jv += W) {
        store(ok + jv, V{});
        const int64_t e = smin<int64_t>(W, cols - jv);
        for (int64_t t = 0; t < e; ++t) ok[jv + t] = alpha * bk[(jv + t) * ldb];
      }
    }
  }
}

// MR rows x NVA vectors of a packed panel (row stride NR = ASAP_NT_NV * W;
// NVA < ASAP_NT_NV for the short last panel of a short sequence).
template <class T, int MR, int NVA>
inline void micro_nt(int64_t K, const T* A, int64_t lda, const T* bp, T* C, int64_t ldc) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W, NR = ASAP_NT_NV * W;
  V acc[MR][NVA];
  // The loops over the whole tile outside the k loop are unrolled by pragma:
  // left to GCC 12, acc went through the stack between the k loop and the
  // stores (two more memory operations per accumulator and tile; the score
  // and output GEMMs were 3-7% of a call faster without them at n = 17-64).
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NVA; ++v) acc[r][v] = V{};
  for (int64_t k = 0; k < K; ++k) {
    V b[NVA];
    for (int v = 0; v < NVA; ++v) b[v] = load<V>(bp + k * NR + v * W);
    for (int r = 0; r < MR; ++r) {
      const V a = splat<V>(A[r * lda + k]);
      for (int v = 0; v < NVA; ++v) acc[r][v] += a * b[v];
    }
  }
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NVA; ++v) store(C + r * ldc + v * W, acc[r][v]);
}

template <class T, int MR, int NVA>
struct NtRem {
  static void run(int rem, int64_t K, const T* A, int64_t lda, const T* bp, T* C, int64_t ldc) {
    if (rem == MR)
      micro_nt<T, MR, NVA>(K, A, lda, bp, C, ldc);
    else
      NtRem<T, MR - 1, NVA>::run(rem, K, A, lda, bp, C, ldc);
  }
};
template <class T, int NVA>
struct NtRem<T, 0, NVA> {
  static void run(int, int64_t, const T*, int64_t, const T*, T*, int64_t) {}
};

template <class T, int NVA>
void panel_nt(int64_t M, int64_t K, const T* A, int64_t lda, const T* bp, T* C, int64_t ldc) {
  constexpr int MR = ASAP_NT_MR;
  int64_t i = 0;
  for (; i + MR <= M; i += MR) micro_nt<T, MR, NVA>(K, A + i * lda, lda, bp, C + i * ldc, ldc);
  if (i < M) NtRem<T, MR - 1, NVA>::run(static_cast<int>(M - i), K, A + i * lda, lda, bp, C + i * ldc, ldc);
}

template <class T, int NVA>
struct NtPanel {
  static void run(int nva, int64_t M, int64_t K, const T* A, int64_t lda, const T* bp, T* C, int64_t ldc) {
    if (nva == NVA)
      panel_nt<T, NVA>(M, K, A, lda, bp, C, ldc);
    else
      NtPanel<T, NVA - 1>::run(nva, M, K, A, lda, bp, C, ldc);
  }
};
template <class T>
struct NtPanel<T, 0> {
  static void run(int, int64_t, int64_t, const T*, int64_t, const T*, T*, int64_t) {}
};

template <class T>
bool last_column_nt(int64_t M, int64_t K, const T* A, int64_t lda, const T* b, T* C, int64_t ldc);

template <class T>
void gemm_nt(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* Bp, T* C, int64_t ldc) {
  constexpr int W = Vec<T>::W, NV = ASAP_NT_NV, NR = NV * W;
  const int64_t panels = (N + NR - 1) / NR;
  for (int64_t p = 0; p < panels; ++p) {
    const T* bp = Bp + p * K * NR;
    const int64_t cols = smin<int64_t>(NR, N - p * NR);
    const int nva = static_cast<int>((cols + W - 1) / W);
    // A panel whose last vector holds one column (n = 17, 33, 49, 65 in
    // float32 with AVX-512): that column as a product of rows in lanes
    // (last_column_nt), the rest by the micro tiles.
    if (cols % W == 1 && last_column_nt<T>(M, K, A, lda, bp + (nva - 1) * W, C + p * NR + (nva - 1) * W, ldc)) {
      if (nva > 1) NtPanel<T, NV>::run(nva - 1, M, K, A, lda, bp, C + p * NR, ldc);
      continue;
    }
    if (nva == NV)
      panel_nt<T, NV>(M, K, A, lda, bp, C + p * NR, ldc);
    else
      NtPanel<T, NV - 1>::run(nva, M, K, A, lda, bp, C + p * NR, ldc);
  }
}

// TA: A is given transposed (A(r, j) at A[j * lda + r]: the final row pass
// on the transposed tile, whose exponentials are E^T); the same sums in the
// same order either way.
template <class T, int MR, int NV, bool TA>
inline void micro_nn(int64_t N, const T* A, int64_t lda, const T* B, int64_t ldb, T* C, int64_t ldc, const T* rs,
                     const T* bs) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W;
  V acc[MR][NV];
  // Unrolled outside the j loop, as in micro_nt.
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[r][v] = V{};
  for (int64_t j = 0; j < N; ++j) {
    V b[NV];
    for (int v = 0; v < NV; ++v) b[v] = load<V>(B + j * ldb + v * W);
    if (bs)
      for (int v = 0; v < NV; ++v) b[v] = b[v] * splat<V>(bs[j]);
    for (int r = 0; r < MR; ++r) {
      const V a = splat<V>(TA ? A[j * lda + r] : A[r * lda + j]);
      for (int v = 0; v < NV; ++v) acc[r][v] += a * b[v];
    }
  }
  if (rs) {
#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] *= splat<V>(rs[r]);
  }
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) store(C + r * ldc + v * W, acc[r][v]);
}

template <class T, int MR, int NV, bool TA>
struct NnRem {
  static void run(int rem, int64_t N, const T* A, int64_t lda, const T* B, int64_t ldb, T* C, int64_t ldc, const T* rs,
                  const T* bs) {
    if (rem == MR)
      micro_nn<T, MR, NV, TA>(N, A, lda, B, ldb, C, ldc, rs, bs);
    else
      NnRem<T, MR - 1, NV, TA>::run(rem, N, A, lda, B, ldb, C, ldc, rs, bs);
  }
};
template <class T, int NV, bool TA>
struct NnRem<T, 0, NV, TA> {
  static void run(int, int64_t, const T*, int64_t, const T*, int64_t, T*, int64_t, const T*, const T*) {}
};

template <class T, int NV, bool TA>
void nn_cols(int64_t M, int64_t N, const T* A, int64_t lda, const T* B, int64_t ldb, T* C, int64_t ldc, const T* rs,
             const T* bs) {
  constexpr int MR = ASAP_NN_MR;
  // Row i of A: A + i * lda, or A + i when A is given transposed.
  const int64_t row_step = TA ? 1 : lda;
  int64_t i = 0;
  for (; i + MR <= M; i += MR)
    micro_nn<T, MR, NV, TA>(N, A + i * row_step, lda, B, ldb, C + i * ldc, ldc, rs ? rs + i : nullptr, bs);
  if (i < M)
    NnRem<T, MR - 1, NV, TA>::run(static_cast<int>(M - i), N, A + i * row_step, lda, B, ldb, C + i * ldc, ldc,
                                  rs ? rs + i : nullptr, bs);
}

template <class T, int NV, bool TA>
struct NnVecRem {
  static void run(int nv, int64_t M, int64_t N, const T* A, int64_t lda, const T* B, int64_t ldb, T* C, int64_t ldc,
                  const T* rs, const T* bs) {
    if (nv == NV)
      nn_cols<T, NV, TA>(M, N, A, lda, B, ldb, C, ldc, rs, bs);
    else
      NnVecRem<T, NV - 1, TA>::run(nv, M, N, A, lda, B, ldb, C, ldc, rs, bs);
  }
};
template <class T, bool TA>
struct NnVecRem<T, 0, TA> {
  static void run(int, int64_t, int64_t, const T*, int64_t, const T*, int64_t, T*, int64_t, const T*, const T*) {}
};

template <class T, bool TA>
void gemm_nn_or_tn(int64_t M, int64_t N, int64_t Nv, const T* A, int64_t lda, const T* B, int64_t ldb, T* C,
                   int64_t ldc, const T* rscale, const T* bscale) {
  constexpr int W = Vec<T>::W, NV = ASAP_NN_NV;
  const int64_t nvec = Nv / W;
  int64_t v = 0;
  for (; v + NV <= nvec; v += NV) nn_cols<T, NV, TA>(M, N, A, lda, B + v * W, ldb, C + v * W, ldc, rscale, bscale);
  if (v < nvec)
    NnVecRem<T, NV - 1, TA>::run(static_cast<int>(nvec - v), M, N, A, lda, B + v * W, ldb, C + v * W, ldc, rscale,
                                 bscale);
}

template <class T>
void gemm_nn(int64_t M, int64_t N, int64_t Nv, const T* A, int64_t lda, const T* B, int64_t ldb, T* C, int64_t ldc,
             const T* rscale, const T* bscale) {
  gemm_nn_or_tn<T, false>(M, N, Nv, A, lda, B, ldb, C, ldc, rscale, bscale);
}

template <class T>
void gemm_tn(int64_t M, int64_t N, int64_t Nv, const T* A, int64_t lda, const T* B, int64_t ldb, T* C, int64_t ldc,
             const T* rscale, const T* bscale) {
  gemm_nn_or_tn<T, true>(M, N, Nv, A, lda, B, ldb, C, ldc, rscale, bscale);
}

template <class T>
void scale_cols(int64_t rows, int64_t cols, T* M, int64_t ld, const T* scale) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W;
  for (int64_t r = 0; r < rows; ++r) {
    T* m = M + r * ld;
    int64_t c = 0;
    for (; c + W <= cols; c += W) store(m + c, load<V>(m + c) * load<V>(scale + c));
    for (; c < cols; ++c) m[c] *= scale[c];
  }
}

// ---------------------------------------------------- log-sum-exp passes ---

template <class T>
void row_lse(int64_t rows, int64_t nc, const T* S, int64_t lds, const T* add, T* lse, T* E, int64_t lde, T* z) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W;
  // Row sums are kept per block of rows and their logs taken vector-wide.
  constexpr int64_t kBlock = 64;
  alignas(64) T zbuf[kBlock];
  int64_t pending = 0;  // rows r - pending .. r - 1 wait for their log
  auto flush = [&](int64_t r_end) {
    if (pending > 0) add_log(zbuf, lse + r_end - pending, pending);
    pending = 0;
  };
  // Rows of 1-4 whole vectors (n = 16, 32, 48, 64 in float32 with AVX-512)
  // are held in registers between the max and the exponential sweep.
  const int nvr = nc % W == 0 && nc <= 4 * W ? static_cast<int>(nc / W) : 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (pending == kBlock) flush(r);
    const T* s = S + r * lds;
    if (nvr > 0) {
      V x[4];
      V mx = splat<V>(neg_inf<T>());
      for (int v = 0; v < nvr; ++v) {
        x[v] = load<V>(s + v * W) + load<V>(add + v * W);
        mx = vmax(mx, x[v]);
      }
      const T m = hmax<T>(mx);
      if (m > neg_inf<T>()) {
        const V mv = splat<V>(m);
        V z0 = V{};
        T* e = E ? E + r * lde : nullptr;
        for (int v = 0; v < nvr; ++v) {
          const V y = vexp_v(x[v] - mv);
          if (e) store(e + v * W, y);
          z0 += y;
        }
        const T zs = hsum<T>(z0);
        lse[r] = m;
        zbuf[pending++] = zs;
        if (z) z[r] = zs;
        continue;
      }
    }
    V m0 = splat<V>(neg_inf<T>()), m1 = m0, m2 = m0, m3 = m0;
    int64_t j = 0;
    for (; j + 4 * W <= nc; j += 4 * W) {
      m0 = vmax(m0, load<V>(s + j) + load<V>(add + j));
      m1 = vmax(m1, load<V>(s + j + W) + load<V>(add + j + W));
      m2 = vmax(m2, load<V>(s + j + 2 * W) + load<V>(add + j + 2 * W));
      m3 = vmax(m3, load<V>(s + j + 3 * W) + load<V>(add + j + 3 * W));
    }
    for (; j + W <= nc; j += W) m0 = vmax(m0, load<V>(s + j) + load<V>(add + j));
    T m = hmax<T>(vmax(vmax(m0, m1), vmax(m2, m3)));
    for (; j < nc; ++j) m = smax(m, s[j] + add[j]);
    if (!(m > neg_inf<T>())) {  // no finite entry: LSE = -inf, zero weights
      flush(r);
      lse[r] = neg_inf<T>();
      if (z) z[r] = T(0);
      if (E)
        for (int64_t jj = 0; jj < nc; ++jj) E[r * lde + jj] = T(0);
      continue;
    }
    const V mv = splat<V>(m);
    V z0 = V{}, z1 = V{};
    j = 0;
    if (E) {
      T* e = E + r * lde;
      for (; j + 2 * W <= nc; j += 2 * W) {
        const V x0 = vexp_v(load<V>(s + j) + load<V>(add + j) - mv);
        const V x1 = vexp_v(load<V>(s + j + W) + load<V>(add + j + W) - mv);
        store(e + j, x0);
        store(e + j + W, x1);
        z0 += x0;
        z1 += x1;
      }
      for (; j + W <= nc; j += W) {
        const V x0 = vexp_v(load<V>(s + j) + load<V>(add + j) - mv);
        store(e + j, x0);
        z0 += x0;
      }
      T zs = hsum<T>(z0 + z1);
      for (; j < nc; ++j) {
        const T x = sexp(s[j] + add[j] - m);
        e[j] = x;
        zs += x;
      }
      lse[r] = m;
      zbuf[pending++] = zs;
      if (z) z[r] = zs;
    } else {
      for (; j + 2 * W <= nc; j += 2 * W) {
        z0 += vexp_v(load<V>(s + j) + load<V>(add + j) - mv);
        z1 += vexp_v(load<V>(s + j + W) + load<V>(add + j + W) - mv);
      }
      for (; j + W <= nc; j += W) z0 += vexp_v(load<V>(s + j) + load<V>(add + j) - mv);
      T zs = hsum<T>(z0 + z1);
      for (; j < nc; ++j) zs += sexp(s[j] + add[j] - m);
      lse[r] = m;
      zbuf[pending++] = zs;
      if (z) z[r] = zs;
    }
  }
  flush(rows);
}

// Column passes work on blocks of NB vectors of columns, rows inner, so the
// block's slice of the chunk stays in L1 between the max and the exp sweep.
constexpr int kColBlock = 4;
// Up to this many rows, the column kernels sweep their last vectors together.
constexpr int64_t kColTailRows = 32;

template <class T, int NB>
inline void col_lse_block(int64_t rows, const T* S, int64_t lds, const T* radd, T* cmax, T* csum) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W;
  V cm[NB];
  for (int b = 0; b < NB; ++b) cm[b] = splat<V>(neg_inf<T>());
  for (int64_t r = 0; r < rows; ++r) {
    const V a = splat<V>(radd[r]);
    const T* s = S + r * lds;
    for (int b = 0; b < NB; ++b) cm[b] = vmax(cm[b], load<V>(s + b * W) + a);
  }
  V M[NB], Z[NB];
  for (int b = 0; b < NB; ++b) {
    const V old = load<V>(cmax + b * W);
    M[b] = vmax(old, cm[b]);
    // Rescale the running sum to the new maximum (old = -inf: sum is 0).
    Z[b] = load<V>(csum + b * W) * vexp_v(old - M[b]);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const V a = splat<V>(radd[r]);
    const T* s = S + r * lds;
    for (int b = 0; b < NB; ++b) Z[b] += vexp_v(load<V>(s + b * W) + a - M[b]);
  }
  for (int b = 0; b < NB; ++b) {
    store(cmax + b * W, M[b]);
    store(csum + b * W, Z[b]);
  }
}

template <class T>
void transpose(int64_t rows, int64_t cols, const T* A, int64_t lda, T* B, int64_t ldb) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W;
  for (int64_t i = 0; i < rows; i += W)
    for (int64_t j = 0; j < cols; j += W) {
      const int64_t rr = smin<int64_t>(W, rows - i), e = smin<int64_t>(W, cols - j);
      if (rr <= 2) {  // one or two rows: shuffled into place, zeros in the other lanes
        const V r1 = rr == 2 ? load<V>(A + (i + 1) * lda + j) : V{};
        two_row_columns<T>(load<V>(A + i * lda + j), r1, rr, e,
                           [&](int64_t t, V v) { store(B + (j + t) * ldb + i, v); });
        continue;
      }
      if (e <= 2) {  // one or two columns: element by element
        for (int64_t t = 0; t < e; ++t) {
          T* b = B + (j + t) * ldb + i;
          for (int64_t s = 0; s < rr; ++s) b[s] = A[(i + s) * lda + j + t];
          for (int64_t s = rr; s < W; ++s) b[s] = T(0);
        }
        continue;
      }
      V r[W];
      if (rr == W && e == W) {  // a whole block: no conditions to unroll around
#pragma GCC unroll 32
        for (int t = 0; t < W; ++t) r[t] = load<V>(A + (i + t) * lda + j);
        transpose_block<T>(r);
#pragma GCC unroll 32
        for (int t = 0; t < W; ++t) store(B + (j + t) * ldb + i, r[t]);
        continue;
      }
      for (int t = 0; t < W; ++t) r[t] = t < rr ? load<V>(A + (i + t) * lda + j) : V{};
      transpose_block<T>(r);
      for (int64_t t = 0; t < e; ++t) store(B + (j + t) * ldb + i, r[t]);  // B's rows past cols are not written
    }
}

// The last rem < W columns of a column kernel as one vector (kernels.h:
// rows are readable up to roundup(nc, W)): lanes past rem are loaded as 0,
// take exp(0) (an exponential near the clamp returned a subnormal before
// the clamp moved, exp_f32 above), and are never stored. From three
// columns on: with fewer keys than a vector (the padded text teacher's
// sequences are mostly under 16 tokens) every column ran the scalar loop.
// One or two columns stay scalar here (asap_bench, AVX-512: a vector tail for
// the one column of n = 17 made the passes 15% slower, for the two of n = 50
// it gained nothing; with the clamp moved, still 6-9% slower at n = 17 by
// build_ab.sh). Where the engine has the tile's other layout, it takes
// them as lines of that layout instead (col_line below).

template <class T>
struct Tail {
  using V = typename Vec<T>::V;
  using U = typename Vec<T>::U;
  using I = typename Vec<T>::UE;
  static constexpr int W = Vec<T>::W;
  decltype(U{} < U{}) keep;  // lanes < rem
  int64_t rem;
  explicit Tail(int64_t r) : rem(r) {
    static constexpr TwoRowMasks<I, W> kM{};
    keep = load<U>(kM.iota) < (U{} + static_cast<I>(r));
  }
  V row(const T* s) const { return keep ? load<V>(s) : V{}; }
  // x[0..rem) as a vector, 0 in the other lanes (x has only rem entries).
  V in(const T* x) const {
    alignas(64) T b[W];
    for (int l = 0; l < W; ++l) b[l] = l < rem ? x[l] : T(0);
    return load<V>(b);
  }
  void out(T* x, V v) const {
    alignas(64) T b[W];
    store(b, v);
    for (int64_t l = 0; l < rem; ++l) x[l] = b[l];
  }
};

// The tails are their own table entries, called by the engine after the
// main kernel on the columns before the last rem: a call from inside the
// main kernel realigned its frame and cost its loops a register (n = 17,
// where no tail is taken, ran 2-5% slower).
template <class T>
void col_lse_tail(int64_t rows, int64_t rem, const T* S, int64_t lds, const T* radd, T* cmax, T* csum) {
  using V = typename Vec<T>::V;
  const Tail<T> tl(rem);
  V cm = splat<V>(neg_inf<T>());
  for (int64_t r = 0; r < rows; ++r) cm = vmax(cm, tl.row(S + r * lds) + splat<V>(radd[r]));
  const V old = tl.in(cmax);
  const V M = vmax(old, cm);
  V Z = vexp_v(tl.keep ? old - M : V{}) * tl.in(csum);
  for (int64_t r = 0; r < rows; ++r) Z += vexp_v(tl.keep ? tl.row(S + r * lds) + splat<V>(radd[r]) - M : V{});
  tl.out(cmax, M);
  tl.out(csum, Z);
}

template <class T>
void col_max_tail(int64_t rows, int64_t rem, const T* S, int64_t lds, const T* radd, T* cmax) {
  using V = typename Vec<T>::V;
  const Tail<T> tl(rem);
  V cm = tl.in(cmax);
  for (int64_t r = 0; r < rows; ++r) cm = vmax(cm, tl.row(S + r * lds) + splat<V>(radd[r]));
  tl.out(cmax, cm);
}

// E's lanes past rem keep what they held (E may be S, read to the same width).
template <class T>
void col_exp_tail(int64_t rows, int64_t rem, const T* S, int64_t lds, const T* radd, const T* cmax, T* csum, T* E,
                  int64_t lde) {
  using V = typename Vec<T>::V;
  const Tail<T> tl(rem);
  const V M = tl.in(cmax);
  V Z = tl.in(csum);
  for (int64_t r = 0; r < rows; ++r) {
    const V x = vexp_v(tl.keep ? tl.row(S + r * lds) + splat<V>(radd[r]) - M : V{});
    T* e = E + r * lde;
    store(e, tl.keep ? x : load<V>(e));
    Z += x;
  }
  tl.out(csum, Z);
}

template <class T>
void col_line(int64_t count, const T* x, const T* add, T* mx, T* sm, T* e, int64_t lde) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W;
  V m0 = splat<V>(neg_inf<T>()), m1 = m0;
  int64_t i = 0;
  for (; i + 2 * W <= count; i += 2 * W) {
    m0 = vmax(m0, load<V>(x + i) + load<V>(add + i));
    m1 = vmax(m1, load<V>(x + i + W) + load<V>(add + i + W));
  }
  for (; i + W <= count; i += W) m0 = vmax(m0, load<V>(x + i) + load<V>(add + i));
  T m = hmax<T>(vmax(m0, m1));
  for (; i < count; ++i) m = smax(m, x[i] + add[i]);
  if (!(m > neg_inf<T>())) {  // no finite entry (not in a compacted tile): a -inf max, a zero sum, as row_lse
    *mx = neg_inf<T>();
    *sm = T(0);
    if (e)
      for (int64_t r = 0; r < count; ++r) e[r * lde] = T(0);
    return;
  }
  const V mv = splat<V>(m);
  V z0 = V{};
  alignas(64) T y[W];
  i = 0;
  for (; i + W <= count; i += W) {
    const V v = vexp_v(load<V>(x + i) + load<V>(add + i) - mv);
    z0 += v;
    if (e) {
      store(y, v);
#pragma GCC unroll 16
      for (int l = 0; l < W; ++l) e[(i + l) * lde] = y[l];
    }
  }
  T z = hsum<T>(z0);
  for (; i < count; ++i) {
    const T v = sexp(x[i] + add[i] - m);
    if (e) e[i * lde] = v;
    z += v;
  }
  *mx = m;
  *sm = z;
}

// The column kernels take kColBlock vectors per sweep down the rows, and, in
// chunks of at most kColTailRows rows, the last 1 to kColBlock - 1 vectors in
// one sweep too: at n = 17 on AVX2 (2 vectors) one-vector sweeps left each
// max and sum a chain of 17 dependent operations per vector. Longer chunks
// keep one-vector sweeps (a 3-vector tail measured slower at n = 50;
// docs/performance.md, "Short rows"). Each column's arithmetic is the same
// whatever the block, so the results do not depend on it.
template <class T, class Block>
inline void col_blocks(int64_t rows, int64_t nc, const Block& block) {
  constexpr int W = Vec<T>::W;
  static_assert(kColBlock == 4, "the tail below covers 1 to 3 vectors");
  int64_t j = 0;
  for (; j + kColBlock * W <= nc; j += kColBlock * W) block(j, std::integral_constant<int, kColBlock>{});
  if (rows > kColTailRows) {
    for (; j + W <= nc; j += W) block(j, std::integral_constant<int, 1>{});
    return;
  }
  switch ((nc - j) / W) {
    case 3:
      block(j, std::integral_constant<int, 3>{});
      break;
    case 2:
      block(j, std::integral_constant<int, 2>{});
      break;
    case 1:
      block(j, std::integral_constant<int, 1>{});
      break;
    default:
      break;
  }
}

template <class T>
void col_lse_chunk(int64_t rows, int64_t nc, const T* S, int64_t lds, const T* radd, T* cmax, T* csum) {
  constexpr int W = Vec<T>::W;
  if (rows <= 0) return;
  col_blocks<T>(rows, nc, [&](int64_t j, auto nb) {
    col_lse_block<T, decltype(nb)::value>(rows, S + j, lds, radd, cmax + j, csum + j);
  });
  for (int64_t j = nc / W * W; j < nc; ++j) {
    T m = neg_inf<T>();
    for (int64_t r = 0; r < rows; ++r) m = smax(m, S[r * lds + j] + radd[r]);
    const T M = smax(cmax[j], m);
    T Z = csum[j] * sexp(cmax[j] - M);
    for (int64_t r = 0; r < rows; ++r) Z += sexp(S[r * lds + j] + radd[r] - M);
    cmax[j] = M;
    csum[j] = Z;
  }
}

template <class T>
void col_max(int64_t rows, int64_t nc, const T* S, int64_t lds, const T* radd, T* cmax) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W;
  col_blocks<T>(rows, nc, [&](int64_t j, auto nbc) {
    constexpr int NB = decltype(nbc)::value;
    V cm[NB];
    for (int b = 0; b < NB; ++b) cm[b] = load<V>(cmax + j + b * W);
    for (int64_t r = 0; r < rows; ++r) {
      const V a = splat<V>(radd[r]);
      const T* s = S + r * lds + j;
      for (int b = 0; b < NB; ++b) cm[b] = vmax(cm[b], load<V>(s + b * W) + a);
    }
    for (int b = 0; b < NB; ++b) store(cmax + j + b * W, cm[b]);
  });
  for (int64_t j = nc / W * W; j < nc; ++j) {
    T m = cmax[j];
    for (int64_t r = 0; r < rows; ++r) m = smax(m, S[r * lds + j] + radd[r]);
    cmax[j] = m;
  }
}

template <class T>
void col_exp(int64_t rows, int64_t nc, const T* S, int64_t lds, const T* radd, const T* cmax, T* csum, T* E,
             int64_t lde) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W;
  col_blocks<T>(rows, nc, [&](int64_t j, auto nbc) {
    constexpr int NB = decltype(nbc)::value;
    V M[NB], Z[NB];
    for (int b = 0; b < NB; ++b) {
      M[b] = load<V>(cmax + j + b * W);
      Z[b] = load<V>(csum + j + b * W);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const V a = splat<V>(radd[r]);
      const T* s = S + r * lds + j;
      T* e = E + r * lde + j;
      for (int b = 0; b < NB; ++b) {
        const V x = vexp_v(load<V>(s + b * W) + a - M[b]);
        store(e + b * W, x);
        Z[b] += x;
      }
    }
    for (int b = 0; b < NB; ++b) store(csum + j + b * W, Z[b]);
  });
  for (int64_t j = nc / W * W; j < nc; ++j) {
    T Z = csum[j];
    for (int64_t r = 0; r < rows; ++r) {
      const T x = sexp(S[r * lds + j] + radd[r] - cmax[j]);
      E[r * lde + j] = x;
      Z += x;
    }
    csum[j] = Z;
  }
}

template <class T>
void plan(int64_t rows, int64_t nc, const T* S, int64_t lds, const T* radd, const T* cadd, T* E, int64_t lde) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W;
  for (int64_t r = 0; r < rows; ++r) {
    const T* s = S + r * lds;
    T* e = E + r * lde;
    const V a = splat<V>(radd[r]);
    int64_t j = 0;
    for (; j + 2 * W <= nc; j += 2 * W) {
      store(e + j, vexp_v(load<V>(s + j) + a + load<V>(cadd + j)));
      store(e + j + W, vexp_v(load<V>(s + j + W) + a + load<V>(cadd + j + W)));
    }
    for (; j + W <= nc; j += W) store(e + j, vexp_v(load<V>(s + j) + a + load<V>(cadd + j)));
    for (; j < nc; ++j) e[j] = sexp(s[j] + radd[r] + cadd[j]);
  }
}

template <class T>
void vexp(int64_t n, const T* x, T* y) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W;
  int64_t i = 0;
  for (; i + W <= n; i += W) store(y + i, vexp_v(load<V>(x + i)));
  for (; i < n; ++i) y[i] = sexp(x[i]);
}

template <class T>
void add_log_t(const T* z, T* out, int64_t count) {
  add_log(z, out, count);
}

template <class T>
void lse_finish_t(const T* mx, const T* sm, T log_m, T* out, int64_t count) {
  lse_finish(mx, sm, log_m, out, count);
}

// mx[j] = -inf and sm[j] = 0 over roundup(count, width) entries, in whole
// vectors: the column kernels load them back as whole vectors, which
// store-to-load forwarding serves from these stores (from the engine's
// scalar stores it cannot, and each such load waited for them to reach the
// cache).
template <class T>
void lse_start(T* mx, T* sm, int64_t count) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W;
  for (int64_t i = 0; i < count; i += W) {
    store(mx + i, splat<V>(neg_inf<T>()));
    store(sm + i, V{});
  }
}

// Shuffle masks of lane_sums, built at compile time: round s (h = W / 2^(s+1))
// adds lane j and lane j + h of the pair's first vector into lane j, and
// lanes j - h and j of its second into lane j + h (j with bit h clear).
template <class I, int W>
struct LaneSumMasks {
  static constexpr int kRounds = log2_width(W);
  I lo[kRounds][W] = {}, hi[kRounds][W] = {};
  constexpr LaneSumMasks() {
    for (int s = 0; s < kRounds; ++s) {
      const int h = W >> (s + 1);
      for (int j = 0; j < W; ++j) {
        lo[s][j] = static_cast<I>((j & h) ? W + (j - h) : j);
        hi[s][j] = static_cast<I>((j & h) ? W + j : j + h);
      }
    }
  }
};

constexpr int bit_reverse(int i, int bits) {
  int r = 0;
  for (int b = 0; b < bits; ++b) r |= ((i >> b) & 1) << (bits - 1 - b);
  return r;
}

// The horizontal sums of W vectors in one vector: lane j is the sum of
// a[bit_reverse(j)] (log2(W) rounds; W - 1 pairs of two-source shuffles and
// an add, against a horizontal reduction per vector). a is overwritten.
template <class V, class U, class I, int W>
inline V lane_sums(V* a) {
  static constexpr LaneSumMasks<I, W> kM{};
#pragma GCC unroll 8
  for (int s = 0; s < LaneSumMasks<I, W>::kRounds; ++s) {
    const U lo = load<U>(kM.lo[s]), hi = load<U>(kM.hi[s]);
    const int pairs = W >> (s + 1);
#pragma GCC unroll 16
    for (int i = 0; i < pairs; ++i)
      a[i] = __builtin_shuffle(a[2 * i], a[2 * i + 1], lo) + __builtin_shuffle(a[2 * i], a[2 * i + 1], hi);
  }
  return a[0];
}

// C[i * ldc] = sum_k A[i * lda + k] b[k * NR] for i < M: the last column of
// a packed panel when it is alone in its vector. As a column of the micro
// tiles it costs a whole vector of multiply-adds per row and k (at n = 17
// the score GEMM's 17th column cost as much as the first 16); here W rows
// in the lanes of one accumulator, their blocks of A transposed in
// registers. Same order as the micro tiles (k ascending, one multiply-add
// per term), so the same bits. K a multiple of W up to 8 W (false
// otherwise: the micro tiles do it).
template <class T>
bool last_column_nt(int64_t M, int64_t K, const T* A, int64_t lda, const T* b, T* C, int64_t ldc) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W, NR = ASAP_NT_NV * W;
  if (K % W != 0 || K > 8 * W) return false;
  int64_t i = 0;
  for (; i + W <= M; i += W) {
    V acc = V{};
    for (int64_t c = 0; c < K; c += W) {
      V r[W];
#pragma GCC unroll 32
      for (int t = 0; t < W; ++t) r[t] = load<V>(A + (i + t) * lda + c);
      transpose_block<T>(r);
#pragma GCC unroll 32
      for (int j = 0; j < W; ++j) acc += r[j] * splat<V>(b[(c + j) * NR]);
    }
#pragma GCC unroll 32
    for (int t = 0; t < W; ++t) C[(i + t) * ldc] = acc[t];
  }
  for (; i < M; ++i) {
    const T* x = A + i * lda;
    T acc = T(0);
    for (int64_t k = 0; k < K; ++k) acc += x[k] * b[k * NR];
    C[i * ldc] = acc;
  }
  return true;
}

// The squared norms (times half_s) of the W float32 rows x[0..W-1] of NV
// vectors each (row i from x[bit_reverse(i)]): each row's squares summed
// lane-wise (one chain up to 4 vectors, two chains joined at the end
// beyond), then lane_sums. Inlined into one loop (sqnorm_blocks_f32) that
// both callers (listed and contiguous rows) run, so their results are the
// same bits; as a function of its own per block it was called through an
// array of row pointers in memory, a third of alpha's instructions at n = 17.
template <class T, int NV>
__attribute__((always_inline)) inline typename Vec<T>::V sqnorm_block_f32(const T* const* x, T half_s) {
  using V = typename Vec<T>::V;
  using U = typename Vec<T>::U;
  using I = typename Vec<T>::UE;
  constexpr int W = Vec<T>::W;
  V a[W];
#pragma GCC unroll 32
  for (int i = 0; i < W; ++i) {
    const T* xi = x[i];
    V acc = load<V>(xi) * load<V>(xi);
    if constexpr (NV <= 4) {
#pragma GCC unroll 8
      for (int c = 1; c < NV; ++c) {
        const V v = load<V>(xi + c * W);
        acc += v * v;
      }
    } else {
      V acc1 = load<V>(xi + W) * load<V>(xi + W);
      int c = 2;
#pragma GCC unroll 8
      for (; c + 1 < NV; c += 2) {
        const V v = load<V>(xi + c * W), w = load<V>(xi + (c + 1) * W);
        acc += v * v;
        acc1 += w * w;
      }
      if (c < NV) {
        const V v = load<V>(xi + c * W);
        acc += v * v;
      }
      acc += acc1;
    }
    a[i] = acc;
  }
  return lane_sums<V, U, I, W>(a) * half_s;
}

// Blocks of W rows (rows listed, or the first rows of q when rows is null),
// NV = d / W vectors a row. Returns the rows done.
template <class T, int NV>
__attribute__((noinline)) int64_t sqnorm_blocks_f32(int64_t count, const int64_t* rows, const T* q, T half_s, T* out) {
  using I = typename Vec<T>::UE;
  constexpr int W = Vec<T>::W, d = NV * W;
  constexpr int kBits = LaneSumMasks<I, W>::kRounds;
  int64_t r = 0;
  for (; r + W <= count; r += W) {
    const T* x[W];
    if (rows) {
#pragma GCC unroll 32
      for (int i = 0; i < W; ++i) x[i] = q + rows[r + bit_reverse(i, kBits)] * d;
    } else {
#pragma GCC unroll 32
      for (int i = 0; i < W; ++i) x[i] = q + (r + bit_reverse(i, kBits)) * d;
    }
    store(out + r, sqnorm_block_f32<T, NV>(x, half_s));
  }
  return r;
}

// sqnorm_blocks_f32 for 8 < nv <= 16 vectors a row, the vectors counted at
// run time: the same two chains as past 4 vectors there.
template <class T>
__attribute__((noinline)) int64_t sqnorm_blocks_f32_long(int64_t count, const int64_t* rows, const T* q, int64_t nv,
                                                         T half_s, T* out) {
  using V = typename Vec<T>::V;
  using U = typename Vec<T>::U;
  using I = typename Vec<T>::UE;
  constexpr int W = Vec<T>::W;
  constexpr int kBits = LaneSumMasks<I, W>::kRounds;
  const int64_t d = nv * W;
  int64_t r = 0;
  for (; r + W <= count; r += W) {
    V a[W];
#pragma GCC unroll 32
    for (int i = 0; i < W; ++i) {
      const int64_t row = r + bit_reverse(i, kBits);
      const T* xi = q + (rows ? rows[row] : row) * d;
      V acc = load<V>(xi) * load<V>(xi), acc1 = load<V>(xi + W) * load<V>(xi + W);
      int64_t c = 2;
      for (; c + 1 < nv; c += 2) {
        const V v = load<V>(xi + c * W), w = load<V>(xi + (c + 1) * W);
        acc += v * v;
        acc1 += w * w;
      }
      if (c < nv) {
        const V v = load<V>(xi + c * W);
        acc += v * v;
      }
      a[i] = acc + acc1;
    }
    store(out + r, lane_sums<V, U, I, W>(a) * half_s);
  }
  return r;
}

// float32 squared norms of W rows at once when d is a multiple of the vector
// width W and at most 16 W (sqnorm_block_f32 up to 8 W, compiled per vector
// count, then sqnorm_blocks_f32_long). That is the reference's own float32
// sum, regrouped (at most 9 + log2(W) rounded adds of positive terms on any
// path: under 1e-6 relative); the float64 path below was 4% of a slice-free
// map's call at n = 17, d = 16, 9% at d = 64 on AVX2 (W = 8), which the limit
// of 4 W sent there, and 7% at d = 96, past the limit of 8 W. Returns the rows
// done.
template <class T>
int64_t row_sqnorm_f32_blocks(int64_t count, const int64_t* rows, const T* q, int64_t d, T half_s, T* out) {
  if constexpr (sizeof(T) != 4) {
    return 0;
  } else {
    constexpr int W = Vec<T>::W;
    if (d % W != 0 || d > 16 * W) return 0;
    if (d > 8 * W) return sqnorm_blocks_f32_long<T>(count, rows, q, d / W, half_s, out);
    switch (d / W) {
      case 1:
        return sqnorm_blocks_f32<T, 1>(count, rows, q, half_s, out);
      case 2:
        return sqnorm_blocks_f32<T, 2>(count, rows, q, half_s, out);
      case 3:
        return sqnorm_blocks_f32<T, 3>(count, rows, q, half_s, out);
      case 4:
        return sqnorm_blocks_f32<T, 4>(count, rows, q, half_s, out);
      case 5:
        return sqnorm_blocks_f32<T, 5>(count, rows, q, half_s, out);
      case 6:
        return sqnorm_blocks_f32<T, 6>(count, rows, q, half_s, out);
      case 7:
        return sqnorm_blocks_f32<T, 7>(count, rows, q, half_s, out);
      default:
        return sqnorm_blocks_f32<T, 8>(count, rows, q, half_s, out);
    }
  }
}

// Squared norms of rows r0..count-1 accumulated in float64 vectors (float32
// inputs widened lane-wise, products exact), one horizontal sum per row.
template <class T, class Row>
void row_sqnorm_t(int64_t r0, int64_t count, const Row& row, const T* q, int64_t d, T half_s, T* out) {
  using D = Vec<double>::V;
  constexpr int WD = Vec<double>::W;
  constexpr int kBitsD = log2_width(WD);
  auto row_acc = [&](const T* x) {
    D acc = D{};
    for (int64_t c = 0; c + WD <= d; c += WD) {
      D v;
      if constexpr (sizeof(T) == 4) {
        typedef float H __attribute__((vector_size(ASAP_VBYTES / 2)));
        v = widen_half<D>(load<H>(x + c));
      } else {
        v = load<D>(x + c);
      }
      acc += v * v;
    }
    return acc;
  };
  int64_t r = r0;
  if (d % WD == 0) {
    // Blocks of WD rows: one accumulator per row, then lane_sums, which
    // leaves row i's sum in lane i, instead of a horizontal reduction per
    // row, which was a sixth of a row pass at n = 17, d = 16.
    for (; r + WD <= count; r += WD) {
      D a[WD];
      for (int i = 0; i < WD; ++i) a[i] = row_acc(q + row(r + bit_reverse(i, kBitsD)) * d);
      const D sum = lane_sums<D, Vec<double>::U, Vec<double>::UE, WD>(a);
      for (int i = 0; i < WD; ++i) out[r + i] = half_s * static_cast<T>(sum[i]);
    }
  }
  for (; r < count; ++r) {
    const T* x = q + row(r) * d;
    double s = tree_reduce<double>(row_acc(x), false);
    for (int64_t c = d / WD * WD; c < d; ++c) s += static_cast<double>(x[c]) * static_cast<double>(x[c]);
    out[r] = half_s * static_cast<T>(s);
  }
}

// rows == nullptr: the rows 0..count-1 of q, contiguous (one call for every
// head of an unmasked batch: no index loads, and one remainder per call
// instead of one per head).
template <class T>
void row_sqnorm(int64_t count, const int64_t* rows, const T* q, int64_t d, T half_s, T* out) {
  const int64_t r0 = row_sqnorm_f32_blocks(count, rows, q, d, half_s, out);
  if (r0 == count) return;
  if (rows)
    row_sqnorm_t(
        r0, count, [rows](int64_t r) { return rows[r]; }, q, d, half_s, out);
  else
    row_sqnorm_t(
        r0, count, [](int64_t r) { return r; }, q, d, half_s, out);
}

template <class T>
void map_tail(int64_t n, const T* alpha, const T* f1, const T* f3, const T* y, T ca, T b1, T b3, T inv_eps, T* x,
              T* phi, T* f) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W;
  // f without centering: f shifted by a constant c gives g shifted by -c in
  // the next closure, and every closure after and the plan exp(S' + f + g)
  // are unchanged, so the mean (a float64 sum and a division on the head's
  // critical path) is only paid when phi is returned, and the outputs are
  // the same bits either way.
  const V vca = splat<V>(ca), vb1 = splat<V>(b1), vb3 = splat<V>(b3), vie = splat<V>(inv_eps);
  int64_t r = 0;
  for (; r + W <= n; r += W) {
    const V a = load<V>(alpha + r);
    V xv = vca * a;
    if (f1) xv += vb1 * load<V>(f1 + r);
    if (f3) xv += vb3 * load<V>(f3 + r);
    if (y) xv += load<V>(y + r);
    store(x + r, xv);
    store(f + r, (xv - a) * vie);
  }
  for (; r < n; ++r) {
    T xs = ca * alpha[r];
    if (f1) xs += b1 * f1[r];
    if (f3) xs += b3 * f3[r];
    if (y) xs += y[r];
    x[r] = xs;
    f[r] = (xs - alpha[r]) * inv_eps;
  }
  if (!phi) return;
  typedef double D __attribute__((vector_size(ASAP_VBYTES)));
  D acc = D{};
  r = 0;
  for (; r + W <= n; r += W) {
    if constexpr (sizeof(T) == 4) {
      typedef float H __attribute__((vector_size(ASAP_VBYTES / 2)));
      acc += widen_half<D>(load<H>(x + r)) + widen_half<D>(load<H>(x + r + W / 2));
    } else {
      acc += load<V>(x + r);
    }
  }
  double sum = tree_reduce<double>(acc, false);
  for (; r < n; ++r) sum += static_cast<double>(x[r]);
  const T mean = static_cast<T>(sum / static_cast<double>(n));
  for (r = 0; r + W <= n; r += W) store(phi + r, load<V>(x + r) - splat<V>(mean));
  for (; r < n; ++r) phi[r] = x[r] - mean;
}

// NB vectors of columns of col_stats, in one sweep of the rows: x = M[r, c]
// and, with kShift, z = x - shift[r]; for each, the running max and the
// sums of x - x0 and of its square (x0 = the column's first x, which keeps
// the variance's subtraction away from the mean's magnitude). Then
// emit(b, max, mean, sd, max z, var z) for each vector b (the last two zero
// without kShift).
template <class T, int NB, bool kShift, class Emit>
inline void col_stats_sweep(int64_t rows, const T* M, int64_t ld, const T* shift, const Emit& emit) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W, NS = kShift ? NB : 1;
  V x0[NB], m[NB], s1[NB], s2[NB], z0[NS], mz[NS], t1[NS], t2[NS];
  const V h0 = kShift ? splat<V>(shift[0]) : V{};
  for (int b = 0; b < NB; ++b) {
    x0[b] = m[b] = load<V>(M + b * W), s1[b] = s2[b] = V{};
    if constexpr (kShift) z0[b] = mz[b] = x0[b] - h0, t1[b] = t2[b] = V{};
  }
  for (int64_t r = 1; r < rows; ++r) {
    const V h = kShift ? splat<V>(shift[r]) : V{};
    for (int b = 0; b < NB; ++b) {
      const V x = load<V>(M + r * ld + b * W);
      m[b] = vmax(m[b], x);
      const V dx = x - x0[b];
      s1[b] += dx;
      s2[b] += dx * dx;
      if constexpr (kShift) {
        const V z = x - h;
        mz[b] = vmax(mz[b], z);
        const V dz = z - z0[b];
        t1[b] += dz;
        t2[b] += dz * dz;
      }
    }
  }
  const V inv = splat<V>(T(1) / static_cast<T>(rows));
  for (int b = 0; b < NB; ++b) {
    const V d1 = s1[b] * inv;
    const V u = x0[b] + d1, sv = vsqrt(vmax(s2[b] * inv - d1 * d1, V{}));
    V mzb = V{}, v = V{};
    if constexpr (kShift) {
      const V e1 = t1[b] * inv;
      mzb = mz[b], v = vmax(t2[b] * inv - e1 * e1, V{});
    }
    emit(b, m[b], u, sv, mzb, v);
  }
}

// The weighted sum of one column's statistics (col_stats' y), vector or scalar.
template <bool kShift, class X, class S>
inline X stats_sum(const S* w, const S* wc, X m, X u, X sd, X mz, X v) {
  X y = w[0] * m + w[1] * u + w[2] * sd;
  if constexpr (kShift) y = y + wc[0] * mz + wc[1] * v;
  return y;
}

template <class T, int NB, bool kShift>
inline void col_stats_block(int64_t rows, const T* M, int64_t ld, const T* shift, T* mx, T* mean, T* sd, T* mxc, T* var,
                            const T* w, const T* wc, T* y) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W;
  col_stats_sweep<T, NB, kShift>(rows, M, ld, shift, [&](int b, V m, V u, V sv, V mz, V v) {
    store(mx + b * W, m);
    store(mean + b * W, u);
    store(sd + b * W, sv);
    if constexpr (kShift) store(mxc + b * W, mz), store(var + b * W, v);
    if (y) {
      const V vw[3] = {splat<V>(w[0]), splat<V>(w[1]), splat<V>(w[2])};
      const V vwc[2] = {kShift ? splat<V>(wc[0]) : V{}, kShift ? splat<V>(wc[1]) : V{}};
      store(y + b * W, stats_sum<kShift>(vw, vwc, m, u, sv, mz, v));
    }
  });
}

// Calls block(std::integral_constant<int, NB>, v) for the nv vectors of
// columns of a statistics kernel: blocks of NB = MAXB vectors from v = 0,
// then one of the rest (NB * 3 or 6 independent chains each).
template <int MAXB, class Block>
inline void stats_blocks(int64_t nv, const Block& block) {
  int64_t v = 0;
  for (; v + MAXB <= nv; v += MAXB) block(std::integral_constant<int, MAXB>{}, v);
  switch (nv - v) {
    case 3:
      if constexpr (MAXB > 3) block(std::integral_constant<int, 3>{}, v);
      break;
    case 2:
      if constexpr (MAXB > 2) block(std::integral_constant<int, 2>{}, v);
      break;
    case 1:
      if constexpr (MAXB > 1) block(std::integral_constant<int, 1>{}, v);
      break;
    default:
      break;
  }
}

template <class T>
void col_stats(int64_t rows, int64_t nc, const T* M, int64_t ld, const T* shift, T* mx, T* mean, T* sd, T* mxc, T* var,
               const T* w, const T* wc, T* y) {
  constexpr int W = Vec<T>::W;
  const int64_t nv = (nc + W - 1) / W;
  if (shift) {  // 8 accumulators a vector: blocks of 2 stay in registers
    stats_blocks<2>(nv, [&](auto nb, int64_t v) {
      const int64_t o = v * W;
      col_stats_block<T, decltype(nb)::value, true>(rows, M + o, ld, shift, mx + o, mean + o, sd + o, mxc + o, var + o,
                                                    w, wc, y ? y + o : nullptr);
    });
  } else {
    stats_blocks<4>(nv, [&](auto nb, int64_t v) {
      const int64_t o = v * W;
      col_stats_block<T, decltype(nb)::value, false>(rows, M + o, ld, nullptr, mx + o, mean + o, sd + o, nullptr,
                                                     nullptr, w, wc, y ? y + o : nullptr);
    });
  }
}

// col_stats of one column given as a contiguous line x [count] (a row of
// S' where the engine has the transposed tile: the one or two rows past its
// last whole vector of lanes, which col_stats would take as a vector of
// mostly idle lanes; at n = 17 that vector was half of the kernel). The same
// statistics, from sums shifted by x[0] (and x[0] - shift[0]), by vectors
// along the line with horizontal reductions at the end, the rest scalar.
// st = {max, mean, sd, max z, var z} (the last two zero without kShift).
template <class T, bool kShift>
inline void line_stats_sweep(int64_t count, const T* x, const T* shift, T* st) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W;
  const T x0 = x[0], z0 = kShift ? x[0] - shift[0] : T(0);
  const V vx0 = splat<V>(x0), vz0 = splat<V>(z0);
  V m = splat<V>(neg_inf<T>()), s1 = V{}, s2 = V{}, mz = m, t1 = V{}, t2 = V{};
  int64_t i = 0;
  for (; i + W <= count; i += W) {
    const V v = load<V>(x + i);
    m = vmax(m, v);
    const V dx = v - vx0;
    s1 += dx;
    s2 += dx * dx;
    if constexpr (kShift) {
      const V z = v - load<V>(shift + i);
      mz = vmax(mz, z);
      const V dz = z - vz0;
      t1 += dz;
      t2 += dz * dz;
    }
  }
  T ms = hmax<T>(m), a1 = hsum<T>(s1), a2 = hsum<T>(s2), mzs = kShift ? hmax<T>(mz) : T(0);
  T b1 = kShift ? hsum<T>(t1) : T(0), b2 = kShift ? hsum<T>(t2) : T(0);
  for (; i < count; ++i) {
    const T v = x[i], dx = v - x0;
    ms = smax(ms, v);
    a1 += dx;
    a2 += dx * dx;
    if constexpr (kShift) {
      const T z = v - shift[i], dz = z - z0;
      mzs = smax(mzs, z);
      b1 += dz;
      b2 += dz * dz;
    }
  }
  const T inv = T(1) / static_cast<T>(count);
  const T d1 = a1 * inv;
  st[0] = ms, st[1] = x0 + d1, st[2] = ssqrt(smax(a2 * inv - d1 * d1, T(0)));
  st[3] = mzs, st[4] = T(0);
  if constexpr (kShift) {
    const T e1 = b1 * inv;
    st[4] = smax(b2 * inv - e1 * e1, T(0));
  }
}

template <class T, bool kShift>
void line_stats_t(int64_t count, const T* x, const T* shift, T* mx, T* mean, T* sd, T* mxc, T* var, const T* w,
                  const T* wc, T* y) {
  T st[5];
  line_stats_sweep<T, kShift>(count, x, shift, st);
  *mx = st[0], *mean = st[1], *sd = st[2];
  if constexpr (kShift) *mxc = st[3], *var = st[4];
  if (y) *y = stats_sum<kShift>(w, wc, st[0], st[1], st[2], st[3], st[4]);
}

template <class T>
void line_stats(int64_t count, const T* x, const T* shift, T* mx, T* mean, T* sd, T* mxc, T* var, const T* w,
                const T* wc, T* y) {
  if (shift)
    line_stats_t<T, true>(count, x, shift, mx, mean, sd, mxc, var, w, wc, y);
  else
    line_stats_t<T, false>(count, x, nullptr, mx, mean, sd, nullptr, nullptr, w, wc, y);
}

// The slice-free statistics map's dual in one kernel (Engine::asap_map's
// path for heads of one block): y_c = col_stats' y of column c < nc of M
// [rows x nc] (ld, whole vectors read), except that the last `lines` columns
// are taken as the lines L + c * ldl [rows] (line_stats), and f[c] = (ca
// alpha[c] + y_c - alpha[c]) * inv_eps (map_tail's f). Nothing past f[nc - 1]
// is written nor alpha[nc - 1] read.
template <class T, bool kShift>
void stats_map_t(int64_t rows, int64_t nc, const T* M, int64_t ld, int64_t lines, const T* L, int64_t ldl,
                 const T* shift, const T* w, const T* wc, const T* alpha, T ca, T inv_eps, T* f) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W;
  const int64_t nm = nc - lines, nv = (nm + W - 1) / W;
  const V vw[3] = {splat<V>(w[0]), splat<V>(w[1]), splat<V>(w[2])};
  const V vwc[2] = {kShift ? splat<V>(wc[0]) : V{}, kShift ? splat<V>(wc[1]) : V{}};
  const V vca = splat<V>(ca), vie = splat<V>(inv_eps);
  stats_blocks<kShift ? 2 : 4>(nv, [&](auto nb, int64_t v0) {
    const int64_t o = v0 * W;
    col_stats_sweep<T, decltype(nb)::value, kShift>(rows, M + o, ld, shift, [&](int b, V m, V u, V sv, V mz, V var) {
      const V y = stats_sum<kShift>(vw, vwc, m, u, sv, mz, var);
      const int64_t c = o + b * W;
      if (c + W <= nm) {
        const V a = load<V>(alpha + c);
        store(f + c, (vca * a + y - a) * vie);
        return;
      }
      T ys[W];
      store(ys, y);
      for (int64_t i = c; i < nm; ++i) f[i] = (ca * alpha[i] + ys[i - c] - alpha[i]) * inv_eps;
    });
  });
  for (int64_t c = nm; c < nc; ++c) {
    T st[5];
    line_stats_sweep<T, kShift>(rows, L + c * ldl, shift, st);
    f[c] = (ca * alpha[c] + stats_sum<kShift>(w, wc, st[0], st[1], st[2], st[3], st[4]) - alpha[c]) * inv_eps;
  }
}

template <class T>
void stats_map(int64_t rows, int64_t nc, const T* M, int64_t ld, int64_t lines, const T* L, int64_t ldl, const T* shift,
               const T* w, const T* wc, const T* alpha, T ca, T inv_eps, T* f) {
  if (shift)
    stats_map_t<T, true>(rows, nc, M, ld, lines, L, ldl, shift, w, wc, alpha, ca, inv_eps, f);
  else
    stats_map_t<T, false>(rows, nc, M, ld, lines, L, ldl, nullptr, w, nullptr, alpha, ca, inv_eps, f);
}

template <class T>
void col_sums(int64_t rows, int64_t nc, const T* M, int64_t ld, T* out) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W;
  const int64_t nv = (nc + W - 1) / W;
  for (int64_t v = 0; v < nv; ++v) {
    V s0 = load<V>(out + v * W), s1 = V{};
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2) {
      s0 += load<V>(M + r * ld + v * W);
      s1 += load<V>(M + (r + 1) * ld + v * W);
    }
    if (r < rows) s0 += load<V>(M + r * ld + v * W);
    store(out + v * W, s0 + s1);
  }
}

template <class T>
bool all_finite(const T* x, int64_t n) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W;
  V a0 = V{}, a1 = V{}, a2 = V{}, a3 = V{};
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    a0 += load<V>(x + i) * T(0);
    a1 += load<V>(x + i + W) * T(0);
    a2 += load<V>(x + i + 2 * W) * T(0);
    a3 += load<V>(x + i + 3 * W) * T(0);
  }
  for (; i + W <= n; i += W) a0 += load<V>(x + i) * T(0);
  T s = 0;
  for (; i < n; ++i) s += x[i] * T(0);
  const V t = (a0 + a1) + (a2 + a3);
  for (int l = 0; l < W; ++l) s += t[l];
  return s == T(0);
}

template <class T>
T peak_fma(int64_t iters, T seed) {
  using V = typename Vec<T>::V;
  constexpr int C = detail::kPeakChains;
  V x[C];
  const V a = V{} + T(0.999999), b = V{} + T(1e-7);
  for (int c = 0; c < C; ++c) x[c] = V{} + (seed + T(c));
  for (int64_t i = 0; i < iters; ++i)
    for (int c = 0; c < C; ++c) x[c] = x[c] * a + b;
  V acc = x[0];
  for (int c = 1; c < C; ++c) acc += x[c];
  T out[Vec<T>::W];
  store(out, acc);
  T sum = 0;
  for (int w = 0; w < Vec<T>::W; ++w) sum += out[w];
  return sum;
}

template <class T>
constexpr detail::KernelTable<T> make_table() {
  // One entry a line, in KernelTable's order.
  // clang-format off
  return detail::KernelTable<T>{ASAP_ISA_NAME,
                                ASAP_NT_MR,
                                ASAP_NT_NV * Vec<T>::W,
                                Vec<T>::W,
                                ASAP_NN_MR,
                                &pack_b<T>,
                                &gemm_nt<T>,
                                &gemm_nn<T>,
                                &gemm_tn<T>,
                                &scale_cols<T>,
                                &row_lse<T>,
                                &transpose<T>,
                                &col_lse_chunk<T>,
                                &col_max<T>,
                                &col_exp<T>,
                                &col_lse_tail<T>,
                                &col_max_tail<T>,
                                &col_exp_tail<T>,
                                &col_line<T>,
                                &plan<T>,
                                &vexp<T>,
                                &add_log_t<T>,
                                &lse_finish_t<T>,
                                &lse_start<T>,
                                &row_sqnorm<T>,
                                &map_tail<T>,
                                &col_stats<T>,
                                &line_stats<T>,
                                &stats_map<T>,
                                &col_sums<T>,
                                &all_finite<T>,
                                &peak_fma<T>};
  // clang-format on
}

constexpr detail::Kernels kTable{make_table<float>(), make_table<double>()};

}  // namespace
}  // namespace ASAP_ISA_NS
}  // namespace fast
}  // namespace asap
