// Lane-parallel sorting networks and sliced potentials (see sort_network.h),
// written once with GCC vector extensions and compiled per instruction set.
// Include only from sort_<isa>.cpp, after defining
//   ASAP_VBYTES   vector width in bytes (16, 32, 64)
//   ASAP_SORT_NS  a namespace name for this copy
//   ASAP_ISA_NAME its display name
// Like kernels_impl.h: internal linkage only, no standard-library inline
// functions, so nothing compiled for a wide instruction set can be chosen by
// the linker for code that runs on a narrower one.
#ifndef ASAP_VBYTES
#error "define ASAP_VBYTES before including sort_impl.h"
#endif

#include <cstddef>
#include <cstdint>
#include <utility>

#include "fast/sort_network.h"

#if defined(__x86_64__) || defined(__i386__)
// Intrinsics are always-inline functions that are never emitted out of line.
#include <immintrin.h>
#endif

namespace asap {
namespace fast {
namespace ASAP_SORT_NS {
namespace {

constexpr int LB = detail::kSortLanes;
constexpr int VB = ASAP_VBYTES;
typedef float F __attribute__((vector_size(VB)));
typedef double D __attribute__((vector_size(VB)));
typedef int32_t I32 __attribute__((vector_size(VB)));
typedef int64_t I64 __attribute__((vector_size(VB)));
typedef uint64_t U64 __attribute__((vector_size(VB)));
typedef uint32_t U32 __attribute__((vector_size(VB)));
typedef float Fh __attribute__((vector_size(VB / 2)));
typedef int32_t I32h __attribute__((vector_size(VB / 2)));
constexpr int W32 = VB / 4, W64 = VB / 8;
constexpr int NV32 = LB / W32;  // vectors of 32-bit elements per row of a lane block
constexpr int NV64 = LB / W64;  // vectors of 64-bit elements per row
static_assert(LB % W32 == 0, "lane block must fill whole vectors");

#include "fast/simd_prelude.h"  // bits_as, load, store for this copy
template <class V>
inline V vmin(V a, V b) {
  return a < b ? a : b;
}
template <class V>
inline V vmax(V a, V b) {
  return a < b ? b : a;
}

// Order-preserving signed images of the values; -0 and +0 tie (x + 0 maps
// -0 to +0), NaNs order like the scalar sort's unsigned keys (sort.h).
inline I32 skey(F x) {
  x += 0.0f;
  const I32 u = bits_as<I32>(x);
  return u ^ ((u >> 31) & 0x7FFFFFFF);
}
inline I64 skey(D x) {
  x += 0.0;
  const I64 u = bits_as<I64>(x);
  return u ^ ((u >> 63) & 0x7FFFFFFFFFFFFFFFll);
}
inline F key_value(I32 s) { return bits_as<F>(s ^ ((s >> 31) & 0x7FFFFFFF)); }
inline D key_value(I64 s) { return bits_as<D>(s ^ ((s >> 63) & 0x7FFFFFFFFFFFFFFFll)); }

// W64 floats widened to doubles: one vcvtps2pd (simd_prelude.h).
inline D widen(Fh x) { return widen_half<D>(x); }

template <class H, class V, size_t... I>
inline H lower_half(V v, std::index_sequence<I...>) {
  return __builtin_shufflevector(v, v, I...);
}
template <class H, class V, size_t... I>
inline H upper_half(V v, std::index_sequence<I...>) {
  return __builtin_shufflevector(v, v, (I + sizeof...(I))...);
}
// The two halves of a vector of 32-bit elements, widened to 64-bit elements.
// By shuffles: through memory (__builtin_memcpy of each half), GCC stored the
// whole vector and reloaded its halves, and the upper half's load waited on
// a failed store-to-load forwarding.
inline void halves(I32 s, I64& lo, I64& hi) {
  constexpr auto idx = std::make_index_sequence<W32 / 2>{};
  lo = __builtin_convertvector(lower_half<I32h>(s, idx), I64);
  hi = __builtin_convertvector(upper_half<I32h>(s, idx), I64);
}
inline void halves(F s, D& lo, D& hi) {
  constexpr auto idx = std::make_index_sequence<W32 / 2>{};
  lo = widen(lower_half<Fh>(s, idx));
  hi = widen(upper_half<Fh>(s, idx));
}

// float32 query words: key in the upper half, position in the lower one.
inline D word_value(I64 w) {
  const I64 s = w >> 32;
  const I64 u = s ^ ((s >> 63) & 0x7FFFFFFF);
  return widen(bits_as<Fh>(__builtin_convertvector(u, I32h)));
}
inline I32h word_pos(I64 w) { return __builtin_convertvector(w, I32h); }

// W64 values of T as doubles, and back (rounded to T).
inline D load_d(const float* p) { return widen(load<Fh>(p)); }
inline D load_d(const double* p) { return load<D>(p); }
inline void store_t(float* p, D x) { store(p, __builtin_convertvector(x, Fh)); }
inline void store_t(double* p, D x) { store(p, x); }
// x rounded to T, as double: what store_t stores and load_d reads back.
template <class T>
inline D as_t(D x) {
  if constexpr (sizeof(T) == 4)
    return widen(__builtin_convertvector(x, Fh));
  else
    return x;
}

// COL[l * ldc + ps[l]] = ph[l] for the LB lanes l; `lane` holds l * ldc.
// (AVX-512's scatter instructions measured no faster than these stores.)
template <class T>
inline void scatter(T* COL, const int32_t* ps, const T* ph, const int32_t* lane) {
  for (int l = 0; l < LB; ++l) COL[lane[l] + ps[l]] = ph[l];
}

// ------------------------------------------------------ sorting networks ---
//
// The words of a lane block live in rows, one per element r: a query part
// (float32: LB int64 words (key << 32) | position; float64: LB int64 keys,
// then LB int64 positions) and/or a key part (float32: LB int32 keys;
// float64: LB int64 keys). Both networks of a block run in one sweep over
// the comparators, on one row pointer per end.

template <class T>
struct Part;
template <>
struct Part<float> {
  static constexpr int64_t q = NV64 * VB, k = NV32 * VB;
};
template <>
struct Part<double> {
  static constexpr int64_t q = 2 * NV64 * VB, k = NV64 * VB;
};

template <class T, bool Q, bool K>
struct Rows {
  static constexpr int64_t koff = Q ? Part<T>::q : 0;
  static constexpr int64_t bytes = (Q ? Part<T>::q : 0) + (K ? Part<T>::k : 0);
};

template <class V, int NV>
inline void cex(V* x, V* y) {
  for (int v = 0; v < NV; ++v) {
    const V p = x[v], q = y[v];
    x[v] = vmin(p, q);
    y[v] = vmax(p, q);
  }
}
// Query parts: float32 words are unique, so min/max; float64 (key, position)
// pairs compare lexicographically (keys by min/max: equal keys are equal either way).
inline void cex_q(float*, char* a, char* b) { cex<I64, NV64>(reinterpret_cast<I64*>(a), reinterpret_cast<I64*>(b)); }
inline void cex_q(double*, char* a, char* b) {
  I64* Ka = reinterpret_cast<I64*>(a);
  I64* Kb = reinterpret_cast<I64*>(b);
  I64* Pa = Ka + NV64;
  I64* Pb = Kb + NV64;
  for (int v = 0; v < NV64; ++v) {
    const I64 ka = Ka[v], kb = Kb[v], pa = Pa[v], pb = Pb[v];
    const I64 sw = (ka > kb) | ((ka == kb) & (pa > pb));
    Ka[v] = vmin(ka, kb);
    Kb[v] = vmax(ka, kb);
    Pa[v] = sw ? pb : pa;
    Pb[v] = sw ? pa : pb;
  }
}
inline void cex_k(float*, char* a, char* b) { cex<I32, NV32>(reinterpret_cast<I32*>(a), reinterpret_cast<I32*>(b)); }
inline void cex_k(double*, char* a, char* b) { cex<I64, NV64>(reinterpret_cast<I64*>(a), reinterpret_cast<I64*>(b)); }

// Every comparator (i, j) of the network: minimum to row i, maximum to row j.
template <class T, bool Q, bool K>
inline void network(char* w, const int32_t* c, int64_t nc) {
  typedef Rows<T, Q, K> R;
  for (int64_t t = 0; t < nc; ++t) {
    char* a = w + static_cast<int64_t>(c[2 * t]) * R::bytes;
    char* b = w + static_cast<int64_t>(c[2 * t + 1]) * R::bytes;
    if (Q) cex_q(static_cast<T*>(nullptr), a, b);
    if (K) cex_k(static_cast<T*>(nullptr), a + R::koff, b + R::koff);
  }
}

// ------------------------------------- networks held in registers (m <= 32) ---
//
// At short lengths the loop above is bound by its memory traffic: every
// compare-exchange loads both rows, which the previous one has just stored
// (perf at m = 17: about 70% of slice_block on the min/max waiting for
// those loads). For m <= kRegNetMax the same comparators are unrolled at
// compile time over one vector per row, held in registers: a float32 query
// part one 64-bit-word vector at a time, a key part one key vector at a
// time. Same comparators in the same order, so the same result.

constexpr int kRegNetMax = 32;
constexpr int kRegNetMaxComps = 191;  // Batcher's count for 32, (5^2 - 5 + 4) 2^3 - 1

struct NetPairs {
  int n = 0;
  int lo[kRegNetMaxComps] = {};
  int hi[kRegNetMaxComps] = {};
};

// The network of sort_network.h's for_each_comparator, as a constant expression.
constexpr NetPairs net_pairs(int m) {
  NetPairs c;
  detail::for_each_comparator(m, [&c](int64_t i, int64_t j) {
    c.lo[c.n] = static_cast<int>(i);
    c.hi[c.n] = static_cast<int>(j);
    ++c.n;
  });
  return c;
}

template <int M>
struct RegNet {
  static constexpr NetPairs pairs = net_pairs(M);
};

template <class V>
inline void cex_reg(V& a, V& b) {
  const V lo = vmin(a, b);
  b = vmax(a, b);
  a = lo;
}

// The comparators of Net (Net::pairs, a NetPairs) on r[], unrolled.
template <class Net, class V, size_t... I>
inline void net_apply([[maybe_unused]] V* r, std::index_sequence<I...>) {  // (m = 1: no comparators)
  (cex_reg(r[Net::pairs.lo[I]], r[Net::pairs.hi[I]]), ...);
}

// Sorts the vectors of type V at w + r * stride (r < M) lane-wise.
template <class V, int M>
inline void regnet_rows(char* w, int64_t stride) {
  V r[M];
  for (int i = 0; i < M; ++i) r[i] = load<V>(w + i * stride);
  net_apply<RegNet<M>>(r, std::make_index_sequence<RegNet<M>::pairs.n>{});
  for (int i = 0; i < M; ++i) store(w + i * stride, r[i]);
}

// regnet_rows for a run-time m in 2..kRegNetMax (false: not handled here).
template <class V, int M = 2>
inline bool regnet_dispatch(int64_t m, char* w, int64_t stride) {
  if constexpr (M > kRegNetMax) {
    return false;
  } else {
    if (m == M) {
      regnet_rows<V, M>(w, stride);
      return true;
    }
    return regnet_dispatch<V, M + 1>(m, w, stride);
  }
}

// The network on rows of Rows<T, Q, K> in registers, where it applies:
// m <= kRegNetMax, and for the query part float32 words (float64 query parts
// are (key, position) pairs, left to the loop above). m = 1 is sorted.
template <class T, bool Q, bool K>
inline bool network_in_registers(char* w, int64_t m) {
  typedef Rows<T, Q, K> R;
  if (m > kRegNetMax || (Q && sizeof(T) != 4)) return false;
  if (m <= 1) return true;
  if (Q)
    for (int v = 0; v < NV64; ++v) regnet_dispatch<I64>(m, w + v * VB, R::bytes);
  if (K) {
    if constexpr (sizeof(T) == 4) {
      for (int v = 0; v < NV32; ++v) regnet_dispatch<I32>(m, w + R::koff + v * VB, R::bytes);
    } else {
      for (int v = 0; v < NV64; ++v) regnet_dispatch<I64>(m, w + R::koff + v * VB, R::bytes);
    }
  }
  return true;
}

// Query part of a row from the LB values at x, with payload (position) p.
inline void put_q(char* row, const float* x, int32_t p) {
  I64* q = reinterpret_cast<I64*>(row);
  const I64 pv = I64{} + static_cast<int64_t>(static_cast<uint32_t>(p));
  for (int k = 0; k < NV32; ++k) {
    I64 lo, hi;
    halves(skey(load<F>(x + k * W32)), lo, hi);
    q[2 * k] = bits_as<I64>(bits_as<U64>(lo) << 32) | pv;
    q[2 * k + 1] = bits_as<I64>(bits_as<U64>(hi) << 32) | pv;
  }
}
inline void put_q(char* row, const double* x, int32_t p) {
  I64* K = reinterpret_cast<I64*>(row);
  const I64 pv = I64{} + static_cast<int64_t>(p);
  for (int k = 0; k < NV64; ++k) {
    K[k] = skey(load<D>(x + k * W64));
    K[NV64 + k] = pv;
  }
}
inline void put_k(char* row, const float* y) {
  I32* k = reinterpret_cast<I32*>(row);
  for (int j = 0; j < NV32; ++j) k[j] = skey(load<F>(y + j * W32));
}
inline void put_k(char* row, const double* y) {
  I64* k = reinterpret_cast<I64*>(row);
  for (int j = 0; j < NV64; ++j) k[j] = skey(load<D>(y + j * W64));
}
// Values (as double) and positions of a sorted query part; values of a key part.
inline void get_q(const char* row, float*, D* x, I32h* pos) {
  const I64* q = reinterpret_cast<const I64*>(row);
  for (int k = 0; k < NV64; ++k) {
    x[k] = word_value(q[k]);
    pos[k] = word_pos(q[k]);
  }
}
inline void get_q(const char* row, double*, D* x, I32h* pos) {
  const I64* K = reinterpret_cast<const I64*>(row);
  for (int k = 0; k < NV64; ++k) {
    x[k] = key_value(K[k]);
    pos[k] = __builtin_convertvector(K[NV64 + k], I32h);
  }
}
inline void get_k(const char* row, float*, D* y) {
  const I32* k = reinterpret_cast<const I32*>(row);
  for (int j = 0; j < NV32; ++j) halves(key_value(k[j]), y[2 * j], y[2 * j + 1]);
}
inline void get_k(const char* row, double*, D* y) {
  const I64* k = reinterpret_cast<const I64*>(row);
  for (int j = 0; j < NV64; ++j) y[j] = key_value(k[j]);
}

template <class T>
void sort_lanes(int64_t m, const T* v, int64_t ldv, const int32_t* payload, const int32_t* comps, int64_t nc,
                void* work, T* out_v, int32_t* out_p) {
  char* w = static_cast<char*>(work);
  T* const tag = nullptr;
  if (payload) {
    typedef Rows<T, true, false> R;
    for (int64_t r = 0; r < m; ++r) put_q(w + r * R::bytes, v + r * ldv, payload[r]);
    if (!network_in_registers<T, true, false>(w, m)) network<T, true, false>(w, comps, nc);
    for (int64_t r = 0; r < m; ++r) {
      D x[NV64];
      I32h pos[NV64];
      get_q(w + r * R::bytes, tag, x, pos);
      for (int k = 0; k < NV64; ++k)
        for (int e = 0; e < W64; ++e) {
          out_v[r * LB + k * W64 + e] = static_cast<T>(x[k][e]);
          out_p[r * LB + k * W64 + e] = pos[k][e];
        }
    }
  } else {
    typedef Rows<T, false, true> R;
    for (int64_t r = 0; r < m; ++r) put_k(w + r * R::bytes, v + r * ldv);
    if (!network_in_registers<T, false, true>(w, m)) network<T, false, true>(w, comps, nc);
    for (int64_t r = 0; r < m; ++r) {
      D y[NV64];
      get_k(w + r * R::bytes, tag, y);
      for (int k = 0; k < NV64; ++k)
        for (int e = 0; e < W64; ++e) out_v[r * LB + k * W64 + e] = static_cast<T>(y[k][e]);
    }
  }
}

// ----------------------------------------------------------- projections ---

template <class T, int MR, int NV>
inline void project_tile(int64_t d, const T* A, int64_t lda, const T* thT, int64_t Lp, T* out) {
  typedef T V __attribute__((vector_size(VB)));
  constexpr int W = VB / static_cast<int>(sizeof(T));
  V acc[MR][NV];
  // Unrolled, so that GCC keeps acc in registers: as a loop, the zeroing
  // became a `rep stos` of MR * NV vectors on the stack and acc went through
  // memory at the end (at MR = 8, NV = 1 about half of the tile's time at d = 16).
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[r][v] = V{};
  for (int64_t k = 0; k < d; ++k) {
    V b[NV];
    for (int v = 0; v < NV; ++v) b[v] = load<V>(thT + k * Lp + v * W);
    for (int r = 0; r < MR; ++r) {
      const V a = A[r * lda + k] - V{};  // a broadcast (x - 0 == x for every x, so no add)
      for (int v = 0; v < NV; ++v) acc[r][v] += a * b[v];
    }
  }
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) store(out + r * Lp + v * W, acc[r][v]);
}

template <class T, int NV, int MR = 1>
inline void project_rows(int64_t mr, int64_t d, const T* A, int64_t lda, const T* thT, int64_t Lp, T* out) {
  if constexpr (MR < 8) {
    if (mr != MR) return project_rows<T, NV, MR + 1>(mr, d, A, lda, thT, Lp, out);
  }
  project_tile<T, MR, NV>(d, A, lda, thT, Lp, out);
}

template <class T, int NV>
inline void project_cols(int64_t rows, int64_t d, const T* A, int64_t lda, const T* thT, int64_t Lp, T* out) {
  // Enough independent accumulators to hide the FMA latency: tiles of at
  // most MR rows, as even as they can be (17 rows as 6 + 6 + 5: as 8 + 8 + 1,
  // the last row was one chain of d dependent multiply-adds).
  constexpr int MR = NV <= 2 ? 8 : 4;
  const int64_t tiles = (rows + MR - 1) / MR;
  int64_t i = 0;
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t mr = rows / tiles + (t < rows % tiles ? 1 : 0);
    project_rows<T, NV>(mr, d, A + i * lda, lda, thT, Lp, out + i * Lp);
    i += mr;
  }
}

// Same accumulation order as the kernels' gemm_nt (k ascending, one fused
// multiply-add per term where the instruction set has them).
template <class T>
void project(int64_t rows, int64_t d, const T* A, int64_t lda, const T* thT, int64_t Lp, T* out) {
  constexpr int W = VB / static_cast<int>(sizeof(T));
  const int64_t nv = Lp / W;
  for (int64_t v0 = 0; v0 < nv; v0 += 4) {
    const int64_t c = nv - v0 < 4 ? nv - v0 : 4;
    const T* th = thT + v0 * W;
    T* o = out + v0 * W;
    if (c == 4)
      project_cols<T, 4>(rows, d, A, lda, th, Lp, o);
    else if (c == 3)
      project_cols<T, 3>(rows, d, A, lda, th, Lp, o);
    else if (c == 2)
      project_cols<T, 2>(rows, d, A, lda, th, Lp, o);
    else
      project_cols<T, 1>(rows, d, A, lda, th, Lp, o);
  }
}

// ------------------------------------------------------ sliced potentials ---

// Last r with xs[r * LB] <= p (std::upper_bound - 1), -1 when none.
inline int64_t last_leq(const double* xs, int64_t m, double p) {
  int64_t first = 0, count = m;
  while (count > 0) {
    const int64_t step = count / 2, it = first + step;
    if (!(p < xs[it * LB])) {
      first = it + 1;
      count -= step + 1;
    } else {
      count = step;
    }
  }
  return first - 1;
}

// Bump allocator over the caller's scratch (64-byte steps).
struct Arena {
  char* p;
  template <class U>
  U* take(int64_t count) {
    U* r = reinterpret_cast<U*>(p);
    p += (static_cast<int64_t>(sizeof(U)) * count + 63) / 64 * 64;
    return r;
  }
};

// u_(1) = 0, u_(r+1) = u_(r) + ys_(r) (xs_(r+1) - xs_(r)); phi_(r) = xs_(r)^2 / 2 - u_(r),
// one sorted row r at a time (x, y: its LB values as NV64 vectors of
// doubles): phi rounded to T into out[LB], the per-lane sums of the stored
// values, and with Extra the sorted values and u, [m][LB] each, for the rows
// that are not keys. NV < NV64: the lanes of NV vectors only (XS, YS, U,
// out and sums then point at the first of them).
template <class T, bool Extra, int NV = NV64>
struct Potentials {
  D u[NV] = {}, xp[NV] = {}, yp[NV] = {}, sum[NV] = {};
  double *XS, *YS, *U;
  inline void row(int64_t r, const D* x, const D* y, T* out) {
    for (int k = 0; k < NV; ++k) {
      if (r > 0) u[k] += yp[k] * (x[k] - xp[k]);
      if (Extra) {
        store(XS + r * LB + k * W64, x[k]);
        store(YS + r * LB + k * W64, y[k]);
        store(U + r * LB + k * W64, u[k]);
      }
      const D p = 0.5 * x[k] * x[k] - u[k];
      store_t(out + k * W64, p);
      sum[k] += as_t<T>(p);
      xp[k] = x[k];
      yp[k] = y[k];
    }
  }
  inline void sums_to(double* sums) const {
    for (int k = 0; k < NV; ++k) store(sums + k * W64, sum[k]);
  }
};

// The potentials of the sorted (key, position) rows at w, scattered to the
// rows of R by position (lane l of COL at COL + l * ldc).
template <class T, bool Extra>
inline void potentials(int64_t m, const char* w, T* COL, int64_t ldc, double* XS, double* YS, double* U, double* sums) {
  typedef Rows<T, true, true> R;
  T* const tag = nullptr;
  alignas(64) int32_t lane[LB];
  for (int l = 0; l < LB; ++l) lane[l] = static_cast<int32_t>(l * ldc);
  Potentials<T, Extra> pot{};
  pot.XS = XS, pot.YS = YS, pot.U = U;
  for (int64_t r = 0; r < m; ++r) {
    D x[NV64], y[NV64];
    I32h pos[NV64];
    get_q(w + r * R::bytes, tag, x, pos);
    get_k(w + r * R::bytes + R::koff, tag, y);
    alignas(64) T ph[LB];
    alignas(64) int32_t ps[LB];
    pot.row(r, x, y, ph);
    for (int k = 0; k < NV64; ++k) store(ps + k * W64, pos[k]);
    scatter(COL, ps, ph, lane);
  }
  pot.sums_to(sums);
}

// The sorted values and u of a block, [m][LB] each, for its rows that are
// not keys (all nullptr when every row is a key).
struct SortedRows {
  double *XS = nullptr, *YS = nullptr, *U = nullptr;
};
template <class T>
inline SortedRows take_sorted_rows(Arena& ar, const detail::SliceBlock<T>& b) {
  SortedRows so;
  if (b.n_extra > 0) {
    so.XS = ar.take<double>(b.m * LB);
    so.YS = ar.take<double>(b.m * LB);
    so.U = ar.take<double>(b.m * LB);
  }
  return so;
}

// The block's columns once COL holds the key rows' potentials (lane l at
// COL + l * ldc) and `sums` their per-lane sums: the rows that are not keys
// (the potential extended by its outer rays, from the sorted values XS, YS
// and U), then the centering over R and the output.
template <class T>
void finish_block(const detail::SliceBlock<T>& b, T* COL, int64_t ldc, const double* XS, const double* YS,
                  const double* U, double* sums) {
  const int64_t m = b.m, nR = b.nR;
  // Rows that are not keys: the potential extended by its outer rays
  // (asap::detail::eval_potential).
  for (int64_t e = 0; e < b.n_extra; ++e) {
    const int64_t row = b.extra[e];
    const T* x = b.XT + row * b.ld;
    for (int l = 0; l < LB; ++l) {
      const double p = static_cast<double>(x[l]);
      const double* xs = XS + l;
      double up;
      if (p < xs[0]) {
        up = YS[l] * (p - xs[0]);
      } else {
        const int64_t r = last_leq(xs, m, p);
        up = U[r * LB + l] + YS[r * LB + l] * (p - xs[r * LB]);
      }
      const T v = static_cast<T>(0.5 * p * p - up);
      COL[l * ldc + row] = v;
      sums[l] += static_cast<double>(v);
    }
  }
  // Center over R and emit (Engine::features' `take`, per slice).
  alignas(64) double mean[LB];
  const D count = D{} + static_cast<double>(nR);
  for (int k = 0; k < NV64; ++k) store(mean + k * W64, load<D>(sums + k * W64) / count);
  if (b.beta) {
    // acc_i += beta_l col_l[i] for l = 0, 1, ... in that order, with the
    // partial sum kept in a register across the lanes (one read-modify-write
    // of acc per lane made each lane wait for the previous one's store).
    for (int l = 0; l < b.lanes; ++l) *b.shift += b.beta[l] * mean[l];
    double* acc = b.acc;
    int64_t i = 0;
    for (; i + W64 <= nR; i += W64) {
      D a = load<D>(acc + i);
      for (int l = 0; l < b.lanes; ++l) a = a + b.beta[l] * load_d(COL + l * ldc + i);
      store(acc + i, a);
    }
    for (; i < nR; ++i) {
      double a = acc[i];
      for (int l = 0; l < b.lanes; ++l) a += b.beta[l] * static_cast<double>(COL[l * ldc + i]);
      acc[i] = a;
    }
  } else {
    for (int l = 0; l < b.lanes; ++l) {
      const T* c = COL + l * ldc;
      T* o = b.psi + l * b.ldpsi;
      int64_t i = 0;
      for (; i + W64 <= nR; i += W64) store_t(o + i, load_d(c + i) - mean[l]);
      for (; i < nR; ++i) o[i] = static_cast<T>(static_cast<double>(c[i]) - mean[l]);
    }
  }
}

// ---------------- float32 blocks of m <= 64 keys: swaps recorded, then undone ---
//
// The (key, position) words above cost the query network two vectors of
// 64-bit words per row and the potentials a scatter of one scalar store
// per lane and row. Here the query network sorts the 32-bit keys alone (one
// vector per row) and records, per comparator, the lanes in which it
// swapped: up to 32 keys in registers; up to 64 as two halves in registers
// and their bitonic merge (merge_halves_recorded). The potentials are computed in sorted
// order as above, then carried back to the keys' own order by the same
// swaps in reverse order, and transposed into the columns W32 rows at a
// time. Tied keys may end in either order; they get the same potential bits
// (across a tie u gains y * 0, and x is the same), so the columns are those
// of the (key, position) sort.

#if ASAP_VBYTES == 64 && (defined(__x86_64__) || defined(__i386__))
typedef __mmask16 SwapMask;  // one bit per lane of a 16-lane key vector
inline SwapMask swaps(I32 a, I32 b) { return _mm512_cmpgt_epi32_mask(bits_as<__m512i>(a), bits_as<__m512i>(b)); }
inline void swap_where(SwapMask s, F& a, F& b) {
  const __m512 x = bits_as<__m512>(a), y = bits_as<__m512>(b);
  a = bits_as<F>(_mm512_mask_blend_ps(s, x, y));
  b = bits_as<F>(_mm512_mask_blend_ps(s, y, x));
}
#else
typedef I32 SwapMask;  // -1 in the lanes that swapped
inline SwapMask swaps(I32 a, I32 b) { return a > b; }
inline void swap_where(SwapMask s, F& a, F& b) {
  const F x = a;
  a = s ? b : a;
  b = s ? x : b;
}
#endif

// A network's comparators in registers, recording the swaps (sort) or
// undoing recorded ones in reverse order (unsort); net_apply runs it
// without recording. Net::pairs is a NetPairs.
template <class Net>
struct Rec {
  static constexpr int N = Net::pairs.n;
  template <size_t... I>
  static void sort([[maybe_unused]] I32* r, [[maybe_unused]] SwapMask* sw, std::index_sequence<I...>) {
    ((sw[I] = swaps(r[Net::pairs.lo[I]], r[Net::pairs.hi[I]]), cex_reg(r[Net::pairs.lo[I]], r[Net::pairs.hi[I]])), ...);
  }
  template <size_t... I>
  static void unsort([[maybe_unused]] F* r, [[maybe_unused]] const SwapMask* sw, std::index_sequence<I...>) {
    (swap_where(sw[N - 1 - I], r[Net::pairs.lo[N - 1 - I]], r[Net::pairs.hi[N - 1 - I]]), ...);
  }
};
template <int M>
using RecNet = Rec<RegNet<M>>;

// Batcher's bitonic merge of 32 rows (a bitonic sequence in, sorted out):
// comparators (i, i + k) for k = 16, 8, 4, 2, 1 and bit k of i clear.
constexpr int kHalf = kRegNetMax;
constexpr NetPairs bitonic_merge_pairs() {
  NetPairs c;
  for (int k = kHalf / 2; k >= 1; k >>= 1)
    for (int i = 0; i < kHalf; ++i)
      if (!(i & k)) {
        c.lo[c.n] = i;
        c.hi[c.n] = i + k;
        ++c.n;
      }
  return c;
}
struct BitonicMerge {
  static constexpr NetPairs pairs = bitonic_merge_pairs();
};
using RecMerge = Rec<BitonicMerge>;
constexpr int kMergeSwaps = kHalf + 2 * RecMerge::N;  // per vector column: half-cleaner, both halves
static_assert(2 * kRegNetMaxComps + kMergeSwaps == detail::kRecordedSwapsMax,
              "sortnet_work_bytes sizes the recorded swaps of these networks");
static_assert(sizeof(SwapMask) <= static_cast<size_t>(4 * W32), "a swap mask takes at most 4 bytes a lane");

// Rows r[i] = p[i * ld] and back, i < M, expanded at compile time: as
// loops over the contiguous rows of QS, KS and PH, GCC turned the stores of
// a spilled r[] into one `rep movsq` (about 15% of the block at m = 17).
template <class V, class P, size_t... I>
inline void load_rows(V* r, const P* p, int64_t ld, std::index_sequence<I...>) {
  ((r[I] = load<V>(p + static_cast<int64_t>(I) * ld)), ...);
}
template <class V, class P, size_t... I>
inline void store_rows(P* p, int64_t ld, const V* r, std::index_sequence<I...>) {
  (store(p + static_cast<int64_t>(I) * ld, r[I]), ...);
}

// Sorts M rows of query keys (the rows kir[i] of XT; recording the swaps at
// sw, N per vector column) and of key keys (rows i of YT) into QS and KS,
// [M][LB] each.
template <int M>
void sort_recorded(const float* XT, int64_t ld, const int32_t* kir, const float* YT, int32_t* QS, int32_t* KS,
                   SwapMask* sw) {
  constexpr int N = RecNet<M>::N;
  for (int v = 0; v < NV32; ++v) {
    I32 r[M];
    for (int i = 0; i < M; ++i) r[i] = skey(load<F>(XT + static_cast<int64_t>(kir[i]) * ld + v * W32));
    RecNet<M>::sort(r, sw + v * N, std::make_index_sequence<N>{});
    store_rows(QS + v * W32, LB, r, std::make_index_sequence<M>{});
    load_rows(r, YT + v * W32, ld, std::make_index_sequence<M>{});
    for (int i = 0; i < M; ++i) r[i] = skey(bits_as<F>(r[i]));
    net_apply<RegNet<M>>(r, std::make_index_sequence<N>{});
    store_rows(KS + v * W32, LB, r, std::make_index_sequence<M>{});
  }
}

// PH [M][LB], in sorted order per lane, back to the keys' order.
template <int M>
void unsort_recorded(float* PH, const SwapMask* sw) {
  constexpr int N = RecNet<M>::N;
  for (int v = 0; v < NV32; ++v) {
    F r[M];
    load_rows(r, PH + v * W32, LB, std::make_index_sequence<M>{});
    RecNet<M>::unsort(r, sw + v * N, std::make_index_sequence<N>{});
    store_rows(PH + v * W32, LB, r, std::make_index_sequence<M>{});
  }
}

// fn(std::integral_constant<int, M>{}) for the run-time m in 1..kRegNetMax.
template <int M = 1, class Fn>
inline void with_m(int64_t m, Fn&& fn) {
  if constexpr (M <= kRegNetMax) {
    if (m == M) {
      fn(std::integral_constant<int, M>{});
      return;
    }
    with_m<M + 1>(m, fn);
  }
}

// The merge of the sorted halves A = [0, 32) and B = [32, 32 + m2) of QS
// (recording its swaps) and of KS, in registers: A followed by B reversed
// and padded with +inf keys is bitonic; one half-cleaner layer (A[i]
// against B[31 - i], in memory: each row is touched once) leaves two
// bitonic halves, every key of the lower one below every key of the upper
// one, and each half is sorted by a 32-row bitonic merge in registers. The
// padding (INT32_MAX, above every key but a NaN's) ends past row 32 + m2.
// Swaps at sw, per vector column: the half-cleaner (by i), the lower half's,
// the upper half's (kMergeSwaps in all).
inline void merge_halves_recorded(int64_t m2, int32_t* QS, int32_t* KS, SwapMask* sw) {
  const int64_t lo0 = kHalf - m2;
  constexpr auto seq = std::make_index_sequence<kHalf>{};
  constexpr auto net = std::make_index_sequence<RecMerge::N>{};
  const I32 pad = I32{} + INT32_MAX;
  for (int v = 0; v < NV32; ++v) {
    SwapMask* hc = sw + v * kMergeSwaps;
    int32_t* q = QS + v * W32;
    int32_t* k = KS + v * W32;
    for (int64_t i = lo0; i < kHalf; ++i) {
      const int64_t a = i * LB, b = (2 * kHalf - 1 - i) * LB;
      const I32 x = load<I32>(q + a), y = load<I32>(q + b);
      hc[i] = swaps(x, y);
      store(q + a, vmin(x, y));
      store(q + b, vmax(x, y));
      const I32 u = load<I32>(k + a), w = load<I32>(k + b);
      store(k + a, vmin(u, w));
      store(k + b, vmax(u, w));
    }
    I32 r[kHalf];
    load_rows(r, q, LB, seq);
    RecMerge::sort(r, hc + kHalf, net);
    store_rows(q, LB, r, seq);
    load_rows(r, k, LB, seq);
    net_apply<BitonicMerge>(r, net);
    store_rows(k, LB, r, seq);
    for (int p = 0; p < 2; ++p) {  // the upper halves of QS (recorded) and KS
      int32_t* base = p == 0 ? q : k;
      for (int64_t t = 0; t < kHalf; ++t) r[t] = t >= lo0 ? load<I32>(base + (2 * kHalf - 1 - t) * LB) : pad;
      if (p == 0)
        RecMerge::sort(r, hc + kHalf + RecMerge::N, net);
      else
        net_apply<BitonicMerge>(r, net);
      for (int64_t t = 0; t < m2; ++t) store(base + (kHalf + t) * LB, r[t]);
    }
  }
}

// Undoes merge_halves_recorded's swaps on PH, in reverse order.
inline void unmerge_halves_recorded(int64_t m2, float* PH, const SwapMask* sw) {
  const int64_t lo0 = kHalf - m2;
  constexpr auto seq = std::make_index_sequence<kHalf>{};
  constexpr auto net = std::make_index_sequence<RecMerge::N>{};
  for (int v = 0; v < NV32; ++v) {
    const SwapMask* hc = sw + v * kMergeSwaps;
    float* ph = PH + v * W32;
    F r[kHalf];
    for (int64_t t = 0; t < kHalf; ++t) r[t] = t < m2 ? load<F>(ph + (kHalf + t) * LB) : F{};
    RecMerge::unsort(r, hc + kHalf + RecMerge::N, net);
    for (int64_t t = lo0; t < kHalf; ++t) store(ph + (2 * kHalf - 1 - t) * LB, r[t]);
    load_rows(r, ph, LB, seq);
    RecMerge::unsort(r, hc + kHalf, net);
    store_rows(ph, LB, r, seq);
    for (int64_t i = lo0; i < kHalf; ++i) {
      F x = load<F>(ph + i * LB), y = load<F>(ph + (2 * kHalf - 1 - i) * LB);
      swap_where(hc[i], x, y);
      store(ph + i * LB, x);
      store(ph + (2 * kHalf - 1 - i) * LB, y);
    }
  }
}

// The recorded sort of a block's m <= 64 keys: m <= 32 in registers;
// otherwise the first 32 rows and the other m - 32 in registers, then their
// merge. Swaps at sw: the first half's, the second half's, the merge's.
inline void sort_block_recorded(const detail::SliceBlock<float>& b, int32_t* QS, int32_t* KS, SwapMask* sw) {
  const int64_t m = b.m, h = m <= kHalf ? m : kHalf;
  int64_t used = 0;
  with_m(h, [&](auto M) {
    sort_recorded<decltype(M)::value>(b.XT, b.ld, b.kir, b.YT, QS, KS, sw);
    used += NV32 * RecNet<decltype(M)::value>::N;
  });
  if (m == h) return;
  with_m(m - h, [&](auto M) {
    sort_recorded<decltype(M)::value>(b.XT, b.ld, b.kir + h, b.YT + h * b.ld, QS + h * LB, KS + h * LB, sw + used);
    used += NV32 * RecNet<decltype(M)::value>::N;
  });
  merge_halves_recorded(m - h, QS, KS, sw + used);
}

// Undoes sort_block_recorded's swaps on PH [m][LB], in reverse order.
inline void unsort_block_recorded(const detail::SliceBlock<float>& b, float* PH, const SwapMask* sw) {
  const int64_t m = b.m, h = m <= kHalf ? m : kHalf;
  int64_t used = 0;
  with_m(h, [&](auto M) { used += NV32 * RecNet<decltype(M)::value>::N; });
  if (m > h) {
    int64_t second = 0;
    with_m(m - h, [&](auto M) { second = NV32 * RecNet<decltype(M)::value>::N; });
    unmerge_halves_recorded(m - h, PH, sw + used + second);
    with_m(m - h, [&](auto M) { unsort_recorded<decltype(M)::value>(PH + h * LB, sw + used); });
  }
  with_m(h, [&](auto M) { unsort_recorded<decltype(M)::value>(PH, sw); });
}

// The potentials of the sorted rows QS, KS (as `potentials`), rounded to
// float into PH [m][LB] in sorted order. One key vector of lanes at a time,
// down all rows: the running state of all LB lanes (u, the previous x and y
// and the sums, NV64 vectors of doubles each) was 16 vectors on AVX2, more
// than the registers with the row's own values, and spilled every row. Each
// lane gets the same operations in the same order either way.
template <bool Extra>
inline void potentials_sorted(int64_t m, const int32_t* QS, const int32_t* KS, float* PH, double* XS, double* YS,
                              double* U, double* sums) {
  constexpr int G = W32 / W64;  // vectors of doubles per key vector
  static_assert(G == 2, "halves() widens a key vector into two vectors of doubles");
  for (int j = 0; j < NV32; ++j) {
    const int64_t off = j * W32;
    Potentials<float, Extra, G> pot{};
    if (Extra) pot.XS = XS + off, pot.YS = YS + off, pot.U = U + off;
    for (int64_t r = 0; r < m; ++r) {
      D x[G], y[G];
      halves(key_value(load<I32>(QS + r * LB + off)), x[0], x[1]);
      halves(key_value(load<I32>(KS + r * LB + off)), y[0], y[1]);
      pot.row(r, x, y, PH + r * LB + off);
    }
    pot.sums_to(sums + off);
  }
}

// COL[l * ldc + kir[r]] = PH[r][l]: when the keys are consecutive rows of R
// (no mask, or padding at one end), W32 rows at a time by an in-register
// transpose; other rows one element at a time.
inline void rows_to_columns(int64_t m, const int32_t* kir, const float* PH, float* COL, int64_t ldc) {
  bool consecutive = true;
  for (int64_t r = 1; r < m; ++r) consecutive = consecutive && kir[r] == kir[0] + r;
  int64_t r0 = 0;
  if (consecutive)
    for (; r0 + W32 <= m; r0 += W32)
      for (int v = 0; v < NV32; ++v) {
        F t[W32];
        for (int i = 0; i < W32; ++i) t[i] = load<F>(PH + (r0 + i) * LB + v * W32);
        transpose_rows<F, U32, uint32_t, W32>(t);
        for (int j = 0; j < W32; ++j) store(COL + (v * W32 + j) * ldc + kir[0] + r0, t[j]);
      }
  for (int64_t r = r0; r < m; ++r)
    for (int l = 0; l < LB; ++l) COL[l * ldc + kir[r]] = PH[r * LB + l];
}

// slice_block for float32 and 2 <= m <= 2 kRegNetMax.
inline void slice_block_recorded(const detail::SliceBlock<float>& b) {
  const int64_t m = b.m, ldc = (b.nR + 7) / 8 * 8;
  Arena ar{static_cast<char*>(b.work)};
  int32_t* QS = ar.take<int32_t>(m * LB);
  int32_t* KS = ar.take<int32_t>(m * LB);
  float* PH = ar.take<float>(m * LB);
  float* COL = ar.take<float>(LB * ldc);
  SwapMask* sw = ar.take<SwapMask>(NV32 * (2 * kRegNetMaxComps + kMergeSwaps));
  sort_block_recorded(b, QS, KS, sw);
  const SortedRows so = take_sorted_rows(ar, b);
  alignas(64) double sums[LB];
  if (so.XS)
    potentials_sorted<true>(m, QS, KS, PH, so.XS, so.YS, so.U, sums);
  else
    potentials_sorted<false>(m, QS, KS, PH, nullptr, nullptr, nullptr, sums);
  unsort_block_recorded(b, PH, sw);
  rows_to_columns(m, b.kir, PH, COL, ldc);
  finish_block(b, COL, ldc, so.XS, so.YS, so.U, sums);
}

template <class T>
void slice_block(const detail::SliceBlock<T>& b) {
  if constexpr (sizeof(T) == 4) {
    if (b.m >= 2 && b.m <= 2 * kRegNetMax) {
      slice_block_recorded(b);
      return;
    }
  }
  typedef Rows<T, true, true> R;
  const int64_t m = b.m, ldc = (b.nR + 7) / 8 * 8;
  Arena ar{static_cast<char*>(b.work)};
  char* w = ar.take<char>(m * R::bytes);
  T* COL = ar.take<T>(LB * ldc);  // the columns, lane l at COL + l * ldc
  for (int64_t r = 0; r < m; ++r) {
    put_q(w + r * R::bytes, b.XT + static_cast<int64_t>(b.kir[r]) * b.ld, b.kir[r]);
    put_k(w + r * R::bytes + R::koff, b.YT + r * b.ld);
  }
  if (!network_in_registers<T, true, true>(w, m)) network<T, true, true>(w, b.comps, b.n_comps);
  const SortedRows so = take_sorted_rows(ar, b);
  // Per lane, the sum over R of the column as stored (rounded to T), for
  // the centering: the key rows' in one vector sweep with the potentials
  // (a sum per lane over its strided column was a serial chain per lane).
  alignas(64) double sums[LB];
  if (so.XS)
    potentials<T, true>(m, w, COL, ldc, so.XS, so.YS, so.U, sums);
  else
    potentials<T, false>(m, w, COL, ldc, nullptr, nullptr, nullptr, sums);
  finish_block(b, COL, ldc, so.XS, so.YS, so.U, sums);
}

template <class T>
constexpr detail::SortNetTable<T> make_sort_table() {
  return detail::SortNetTable<T>{ASAP_ISA_NAME, &project<T>, &sort_lanes<T>, &slice_block<T>};
}

constexpr detail::SortNetKernels kSortTable{make_sort_table<float>(), make_sort_table<double>()};

}  // namespace
}  // namespace ASAP_SORT_NS
}  // namespace fast
}  // namespace asap
