// Stable sorting of floating-point keys with their indices, for the sliced
// potentials and ESP attention, on order-preserving integer images of the
// keys: a distribution (bucket) sort for float32 data spread over a range,
// LSD radix sort otherwise (8-bit digits, all histograms in one pass, digits
// on which every key agrees skipped), insertion sort for short inputs. All
// are stable: with indices given in increasing order, ties stay in index
// order, which is the features' tie rule (asap-math.md section 4). Measured
// at 8-9 ns per element for the float32 argsort at m = 256-4096 (std::sort
// on the same 64-bit key-and-index words: 24-35; Highway's vqsort: 5.2-5.6;
// tools/experiments/vqsort_bench.md, and docs/performance.md for why vqsort
// is not used).
// The sliced features use these where the lane-parallel sorting networks of
// sort_network.h do not win (long sequences, float64 without AVX2, few slices).
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

namespace asap {
namespace fast {
namespace detail {

inline uint32_t sort_key(float x) {
  x += 0.0f;  // -0 -> +0, so that -0 and +0 tie as they do under operator<
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
inline uint64_t sort_key(double x) {
  x += 0.0;
  uint64_t u;
  std::memcpy(&u, &x, 8);
  return (u & 0x8000000000000000ull) ? ~u : (u | 0x8000000000000000ull);
}

template <class T>
struct SortKeyOf;
template <>
struct SortKeyOf<float> {
  using type = uint32_t;
};
template <>
struct SortKeyOf<double> {
  using type = uint64_t;
};

inline float key_value(uint32_t k) {
  const uint32_t u = (k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
inline double key_value(uint64_t k) {
  const uint64_t u = (k & 0x8000000000000000ull) ? (k & 0x7FFFFFFFFFFFFFFFull) : ~k;
  double x;
  std::memcpy(&x, &u, 8);
  return x;
}

// Reusable buffers for the sorts below.
template <class T>
struct SortScratch {
  using K = typename SortKeyOf<T>::type;
  std::vector<K> k0, k1;
  std::vector<int32_t> i0, i1;
  std::vector<uint64_t> p0, p1;
  std::vector<uint32_t> hist;
};

// A 256-bin histogram into bucket start offsets, in place.
inline void exclusive_scan_256(uint32_t* h) {
  uint32_t sum = 0;
  for (int b = 0; b < 256; ++b) {
    const uint32_t c = h[b];
    h[b] = sum;
    sum += c;
  }
}

// Insertion sort of a[0..m) by word (stable for equal words); fast on
// short or nearly sorted input, where branches mispredict only at inversions.
template <class U>
void insertion_words(U* a, int64_t m) {
  for (int64_t i = 1; i < m; ++i) {
    const U w = a[i];
    if (!(a[i - 1] > w)) continue;
    int64_t j = i - 1;
    while (j >= 0 && a[j] > w) {
      a[j + 1] = a[j];
      --j;
    }
    a[j + 1] = w;
  }
}

// LSD radix sort of a[0..m) on bytes [lo, hi) of each word (stable);
// returns whichever of a, tmp holds the result.
template <class U>
U* radix_words(U* a, U* tmp, int64_t m, int lo, int hi, std::vector<uint32_t>& hist_buf) {
  if (m <= 48) {  // insertion sort on the whole word: same order for these uses
    insertion_words(a, m);
    return a;
  }
  const int nd = hi - lo;
  hist_buf.assign(static_cast<size_t>(nd) * 256, 0);
  uint32_t* h = hist_buf.data();
  for (int64_t r = 0; r < m; ++r) {
    const U w = a[r];
    for (int dg = 0; dg < nd; ++dg) ++h[dg * 256 + ((w >> (8 * (lo + dg))) & 0xFF)];
  }
  for (int dg = 0; dg < nd; ++dg) {
    uint32_t* hd = h + dg * 256;
    const int shift = 8 * (lo + dg);
    if (hd[(a[0] >> shift) & 0xFF] == static_cast<uint32_t>(m)) continue;  // all words share this byte
    exclusive_scan_256(hd);
    for (int64_t r = 0; r < m; ++r) {
      const U w = a[r];
      tmp[hd[(w >> shift) & 0xFF]++] = w;
    }
    std::swap(a, tmp);
  }
  return a;
}

// Distribution sort for float keys: bucket = floor((x - min) * (m-1) /
// (max - min)), a non-decreasing function of x in floating point, so
// buckets are ordered; words are scattered in input order and each bucket
// is insertion-sorted, which keeps the sort stable and exact. O(m) for
// continuous data (projections), where radix sort spends most of its time
// on the few distinct top bytes. `key_hi` maps a word to its sort key (the
// word order must agree with the key order, ties broken by the low bits).
// Returns false (nothing done) when a bucket gets crowded (heavy ties or
// clustered values): the caller then uses radix sort.
template <class U, class KeyOf>
bool bucket_words(U* a, U* tmp, int64_t m, const KeyOf& key_of, std::vector<uint32_t>& count_buf) {
  float lo = key_value(key_of(a[0])), hi = lo;
  for (int64_t r = 1; r < m; ++r) {
    const float x = key_value(key_of(a[r]));
    lo = x < lo ? x : lo;
    hi = x > hi ? x : hi;
  }
  if (!(hi > lo) || !(hi - lo < 3e38f)) return false;  // all equal, NaN or huge range: radix
  const float scale = static_cast<float>(m - 1) / (hi - lo);
  count_buf.assign(static_cast<size_t>(2 * m) + 1, 0);
  uint32_t* cnt = count_buf.data();
  uint32_t* bk = cnt + m + 1;  // each word's bucket
  for (int64_t r = 0; r < m; ++r) {
    int64_t b = static_cast<int64_t>((key_value(key_of(a[r])) - lo) * scale);
    b = b < 0 ? 0 : (b >= m ? m - 1 : b);
    bk[r] = static_cast<uint32_t>(b);
    ++cnt[b + 1];
  }
  uint32_t crowded = 0;
  for (int64_t b = 1; b <= m; ++b) {
    crowded = cnt[b] > crowded ? cnt[b] : crowded;
    cnt[b] += cnt[b - 1];
  }
  if (crowded > 32) return false;
  for (int64_t r = 0; r < m; ++r) tmp[cnt[bk[r]]++] = a[r];
  // Nearly sorted now (disorder only inside buckets): one insertion pass.
  insertion_words(tmp, m);
  return true;
}

// The m values v[0..m) in ascending order, as doubles.
template <class T>
void sorted_values(int64_t m, const T* v, SortScratch<T>& s, double* out) {
  using K = typename SortKeyOf<T>::type;
  s.k0.resize(m);
  s.k1.resize(m);
  for (int64_t r = 0; r < m; ++r) s.k0[r] = sort_key(v[r]);
  const K* k = nullptr;
  if constexpr (sizeof(K) == 4) {
    if (m > 48 && bucket_words<K>(
                      s.k0.data(), s.k1.data(), m, [](K w) { return w; }, s.hist))
      k = s.k1.data();
  }
  if (!k) k = radix_words<K>(s.k0.data(), s.k1.data(), m, 0, static_cast<int>(sizeof(K)), s.hist);
  for (int64_t r = 0; r < m; ++r) out[r] = static_cast<double>(key_value(k[r]));
}

// Sorts the m values val[idx[0..m)] (given as keys via key_of(r) for r in
// 0..m) ascending; returns the order (positions r in 0..m) in `order`, stable.
// get(r) must return the T value at position r.
template <class T, class Get>
void sort_order(int64_t m, const Get& get, SortScratch<T>& s, std::vector<int32_t>& order) {
  using K = typename SortKeyOf<T>::type;
  constexpr int kDigits = static_cast<int>(sizeof(K));
  s.k0.resize(m);
  s.i0.resize(m);
  for (int64_t r = 0; r < m; ++r) {
    s.k0[r] = sort_key(get(r));
    s.i0[r] = static_cast<int32_t>(r);
  }
  order.resize(m);
  if (m <= 48) {  // insertion sort: stable, strict comparison
    for (int64_t a = 1; a < m; ++a) {
      const K key = s.k0[a];
      const int32_t id = s.i0[a];
      int64_t b = a - 1;
      while (b >= 0 && s.k0[b] > key) {
        s.k0[b + 1] = s.k0[b];
        s.i0[b + 1] = s.i0[b];
        --b;
      }
      s.k0[b + 1] = key;
      s.i0[b + 1] = id;
    }
    std::memcpy(order.data(), s.i0.data(), m * sizeof(int32_t));
    return;
  }
  s.k1.resize(m);
  s.i1.resize(m);
  s.hist.assign(static_cast<size_t>(kDigits) * 256, 0);
  uint32_t* h = s.hist.data();
  for (int64_t r = 0; r < m; ++r) {
    const K key = s.k0[r];
    for (int dg = 0; dg < kDigits; ++dg) ++h[dg * 256 + ((key >> (8 * dg)) & 0xFF)];
  }
  K* ks = s.k0.data();
  K* kd = s.k1.data();
  int32_t* is = s.i0.data();
  int32_t* id = s.i1.data();
  for (int dg = 0; dg < kDigits; ++dg) {
    uint32_t* hd = h + dg * 256;
    if (hd[(ks[0] >> (8 * dg)) & 0xFF] == static_cast<uint32_t>(m)) continue;  // all keys share this digit
    exclusive_scan_256(hd);
    for (int64_t r = 0; r < m; ++r) {
      const K key = ks[r];
      const uint32_t pos = hd[(key >> (8 * dg)) & 0xFF]++;
      kd[pos] = key;
      id[pos] = is[r];
    }
    std::swap(ks, kd);
    std::swap(is, id);
  }
  std::memcpy(order.data(), is, m * sizeof(int32_t));
}

}  // namespace detail
}  // namespace fast
}  // namespace asap

namespace asap {
namespace fast {
namespace detail {

// Stable order of v[0..m) (ties by position) and the sorted values.
inline void sorted_with_order(int64_t m, const float* v, SortScratch<float>& s, std::vector<int32_t>& order,
                              double* out) {
  // One 64-bit word per element: key in the upper half, position below, so
  // sorting on the upper four bytes is stable and moves a single array.
  s.p0.resize(m);
  s.p1.resize(m);
  for (int64_t r = 0; r < m; ++r) s.p0[r] = (static_cast<uint64_t>(sort_key(v[r])) << 32) | static_cast<uint64_t>(r);
  const uint64_t* w;
  if (m > 48 && bucket_words<uint64_t>(
                    s.p0.data(), s.p1.data(), m, [](uint64_t x) { return static_cast<uint32_t>(x >> 32); }, s.hist))
    w = s.p1.data();
  else
    w = radix_words<uint64_t>(s.p0.data(), s.p1.data(), m, 4, 8, s.hist);
  order.resize(m);
  for (int64_t r = 0; r < m; ++r) {
    order[r] = static_cast<int32_t>(w[r] & 0xFFFFFFFFu);
    out[r] = static_cast<double>(key_value(static_cast<uint32_t>(w[r] >> 32)));
  }
}
inline void sorted_with_order(int64_t m, const double* v, SortScratch<double>& s, std::vector<int32_t>& order,
                              double* out) {
  sort_order<double>(
      m, [v](int64_t r) { return v[r]; }, s, order);
  for (int64_t r = 0; r < m; ++r) out[r] = v[order[r]];
}

}  // namespace detail
}  // namespace fast
}  // namespace asap
