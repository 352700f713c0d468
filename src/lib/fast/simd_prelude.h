// Bit casts, loads, stores and the in-register transpose of GCC vector
// types, shared by the per-ISA
// copies of the kernels (kernels_impl.h) and of the sorting networks
// (sort_impl.h). No include guard and no namespace on purpose: each copy
// includes it inside its own instruction-set namespace, after its
// `#pragma GCC target`, so that every copy gets its own instantiations
// (one shared instantiation could carry AVX-512 code into the generic path).
template <class To, class From>
inline To bits_as(const From& f) {
  static_assert(sizeof(To) == sizeof(From), "bit cast between different sizes");
  To t;
  __builtin_memcpy(&t, &f, sizeof(To));
  return t;
}
template <class V, class T>
inline V load(const T* p) {
  V v;
  __builtin_memcpy(&v, p, sizeof(V));
  return v;
}
template <class V, class T>
inline void store(T* p, const V& v) {
  __builtin_memcpy(p, &v, sizeof(V));
}

// Half a vector of floats (H, ASAP_VBYTES / 2 bytes) widened to a vector of
// doubles (D, ASAP_VBYTES): one vcvtps2pd. GCC 12 splits
// __builtin_convertvector of 8 floats into two 4-float conversions and an
// insert with AVX-512, and of 4 floats with AVX2 into two 2-float
// conversions, the upper pair stored to the stack and reloaded (the sorting
// networks' potentials 1-2% faster without: docs/performance.md, "Integer
// divisions per head"). The includer provides <immintrin.h> on x86.
template <class D, class H>
inline D widen_half(H x) {
  static_assert(sizeof(D) == 2 * sizeof(H), "a half vector of floats to a vector of doubles");
#if ASAP_VBYTES == 64 && (defined(__x86_64__) || defined(__i386__))
  return bits_as<D>(_mm512_cvtps_pd(bits_as<__m256>(x)));
#elif ASAP_VBYTES == 32 && (defined(__x86_64__) || defined(__i386__))
  return bits_as<D>(_mm256_cvtps_pd(bits_as<__m128>(x)));
#else
  return __builtin_convertvector(x, D);
#endif
}

// log2 of a vector width (1 for a single lane: one round that does nothing).
constexpr int log2_width(int W) { return W <= 2 ? 1 : 1 + log2_width(W / 2); }

// Shuffle masks of transpose_rows, built at compile time: round s (h = 2^s)
// takes lane j of the new row i from row i ("lo", bit h of i clear) or row
// i | h ("hi"); indices >= W pick from the second operand.
template <class I, int W>
struct TransposeMasks {
  static constexpr int kRounds = log2_width(W);
  I lo[kRounds][W] = {}, hi[kRounds][W] = {};
  constexpr TransposeMasks() {
    for (int s = 0; s < kRounds; ++s) {
      const int h = 1 << s;
      for (int j = 0; j < W; ++j) {
        lo[s][j] = static_cast<I>((j & h) ? W + (j ^ h) : j);
        hi[s][j] = static_cast<I>((j & h) ? W + j : (j ^ h));
      }
    }
  }
};

// Transposes the W x W block held in r[0..W) (row t = r[t]; V has W lanes,
// U is the unsigned integer vector of its width with elements I) in place:
// for every bit h of the lane index, the lanes whose row and column bits h
// differ swap across the row pair (i, i | h). log2(W) rounds of two-source
// shuffles (vpermt2ps with AVX-512).
template <class V, class U, class I, int W>
inline void transpose_rows(V* r) {
  static constexpr TransposeMasks<I, W> kM{};
  static_assert((1 << TransposeMasks<I, W>::kRounds) == W, "vector width must be a power of two up to 32");
#pragma GCC unroll 8
  for (int s = 0; s < TransposeMasks<I, W>::kRounds; ++s) {
    const int h = 1 << s;
    const U lo = load<U>(kM.lo[s]), hi = load<U>(kM.hi[s]);
#pragma GCC unroll 32
    for (int i = 0; i < W; ++i) {
      if (i & h) continue;
      const V a = r[i], b = r[i | h];
      r[i] = __builtin_shuffle(a, b, lo);
      r[i | h] = __builtin_shuffle(a, b, hi);
    }
  }
}
