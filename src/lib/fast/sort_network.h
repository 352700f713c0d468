// Lane-parallel sliced potentials for short sequences: one slice per SIMD
// lane, a data-independent sorting network per lane (at short n a scalar sort
// per slice is branch-bound; docs/performance.md).
//
// Layout: a block of kSortLanes slices is sorted at once. Values are stored
// transposed, [m][kSortLanes] (row r = token, lane l = slice), so that one
// compare-exchange of the network is a vector min/max over all lanes.
//
// Network: Batcher's odd-even merge sort for the next power of two P >= m
// (sort_network below). The m real elements come first and the P - m
// padding elements would be larger than all of them (+inf keys, indices
// beyond every real one). With every comparator putting its minimum at the
// lower position, such padding never moves and every comparator that
// touches it is a no-op, so those comparators are dropped and no padding is
// stored: what remains sorts the m real elements.
//
// Order: keys are the order-preserving signed-integer images of the values
// (-0 maps to +0, as in sort.h); query words carry the row position as
// payload and compare (key, position) lexicographically, so the result is
// the stable order of the scalar sorts (ties by token index). float32 query
// words are single int64s (key << 32 | position), so a compare-exchange is
// one min and one max; float64 ones are (key, position) pairs.
// (float32 blocks of m <= 64 keys carry no positions: the query network
// records its swaps and undoes them on the potentials; sort_impl.h,
// slice_block_recorded.)
//
// Compiled per instruction set like the kernels (sort_generic.cpp,
// sort_avx2.cpp, sort_avx512.cpp, each including sort_impl.h under its own
// `#pragma GCC target`); this header is all those files include.
#pragma once
#include <cstddef>
#include <cstdint>

namespace asap {
namespace fast {
namespace detail {

// Slices per lane block.
constexpr int kSortLanes = 16;

// One lane block of the features of one head (see Engine::features).
template <class T>
struct SliceBlock {
  int64_t m = 0;                   // active keys (sorted elements per lane)
  int64_t nR = 0;                  // rows R (query rows with mass)
  int lanes = kSortLanes;          // real slices in this block; lanes beyond are padding
  const T* XT = nullptr;           // [nR][ld]: query projections, lane 0 of the block at XT[0]
  const T* YT = nullptr;           // [m][ld]: active key projections
  int64_t ld = 0;                  // lanes per row of XT and YT (a multiple of kSortLanes)
  const int32_t* kir = nullptr;    // [m]: position in R of each active key (ascending)
  const int32_t* extra = nullptr;  // positions in R of rows that are not keys
  int64_t n_extra = 0;
  const int32_t* comps = nullptr;  // comparator pairs (i, j), i < j < m
  int64_t n_comps = 0;
  void* work = nullptr;  // sortnet_work_bytes(m, nR) bytes, 64-byte aligned
  // Output, like Engine::features: with beta, acc[i] += sum_l beta[l] col_l[i]
  // and *shift += sum_l beta[l] mean_l; without, psi[l * ldpsi + i] = col_l[i] - mean_l.
  const double* beta = nullptr;
  double* acc = nullptr;
  double* shift = nullptr;
  T* psi = nullptr;
  int64_t ldpsi = 0;
};

template <class T>
struct SortNetTable {
  const char* isa;
  // out[i * Lp + l] = sum_k A[i * lda + k] * thT[k * Lp + l] (Lp a multiple of
  // kSortLanes): the projections of `rows` vectors on all slices, one GEMM.
  void (*project)(int64_t rows, int64_t d, const T* A, int64_t lda, const T* thT, int64_t Lp, T* out);
  // Sorts each lane of v [m][ldv] (lanes 0..kSortLanes) ascending with the
  // comparators `comps`: values to out_v [m][kSortLanes]; with a payload
  // (positions, ascending in r), by (value, payload) and the payloads to
  // out_p [m][kSortLanes]. For the tests.
  void (*sort_lanes)(int64_t m, const T* v, int64_t ldv, const int32_t* payload, const int32_t* comps, int64_t n_comps,
                     void* work, T* out_v, int32_t* out_p);
  // The slice columns of one lane block (SliceBlock).
  void (*slice_block)(const SliceBlock<T>& b);
};

struct SortNetKernels {
  SortNetTable<float> f32;
  SortNetTable<double> f64;
};

// One table per instruction set compiled in; nullptr when not compiled.
const SortNetKernels* sortnet_generic();
const SortNetKernels* sortnet_avx2();
const SortNetKernels* sortnet_avx512();

// The table of the instruction set `isa` ("generic", "avx2", "avx512"), the
// same one the kernel table of that name was compiled for.
const SortNetKernels& sortnet_for(const char* isa);

// Calls visit(i, j) for every comparator (i < j < m) of Batcher's odd-even
// merge sort for P = 2^k >= m elements (the iterative form: merges of runs
// of p, comparators at distance k), in order, keeping only those whose both
// ends are real elements. A constant expression when visit is: the
// networks unrolled at compile time (sort_impl.h) and the run-time list
// below are this one loop.
template <class Visit>
constexpr void for_each_comparator(int64_t m, Visit&& visit) {
  int64_t P = 1;
  while (P < m) P <<= 1;
  for (int64_t p = 1; p < P; p <<= 1)
    for (int64_t k = p; k >= 1; k >>= 1)
      for (int64_t j = k % p; j + k < P; j += 2 * k)
        for (int64_t i = 0; i < k && i + j + k < P; ++i)
          if ((i + j) / (2 * p) == (i + j + k) / (2 * p) && i + j + k < m) visit(i + j, i + j + k);
}

// The comparator pairs (i, j) of the pruned odd-even merge sort of m
// elements (see above), as 2 * count int32s; built once per m, thread-safe.
const int32_t* sort_network(int64_t m, int64_t* count);

// Which sort the sliced features use (engine.cpp): the networks where they
// win, the scalar sorts of sort.h otherwise (see use_network).
enum class SortPath { kAuto, kScalar, kNetwork };
// Initially from the environment: ASAP_FAST_SORT=auto|scalar|network.
SortPath sort_path();
// Process-wide override for tests and benchmarks (not thread-safe against running calls).
void set_sort_path(SortPath p);
// Under kAuto: whether L slices of m active keys are sorted by the networks
// with the kernels of `isa` in float64 (f64) or float32. Measured crossover
// lengths per instruction set and dtype, for full and partly filled lane
// blocks (sort_network.cpp); env ASAP_FAST_SORT_NETWORK_MAX=N replaces the
// rule by m <= N.
bool use_network(const char* isa, bool f64, int64_t L, int64_t m);

// Bytes of scratch that sort_lanes and slice_block need.
// The most swaps the float32 networks of m <= 64 keys record per lane: both
// halves' networks (191 comparators each, Batcher's count for 32) and their
// merge (a 32-row half-cleaner, then a 32-row bitonic merge of 80
// comparators per half). sort_impl.h checks it against its own networks.
constexpr int kRecordedSwapsMax = 2 * 191 + 32 + 2 * 80;

inline size_t sortnet_work_bytes(int64_t m, int64_t nR) {
  // Per element of a lane: the query and key words (at most 24 bytes, float64),
  // for rows that are not keys the sorted values and u (24 bytes); per row of
  // R the column values (float64); the recorded swaps (kRecordedSwapsMax,
  // 4 bytes a lane); slack for alignment.
  const size_t per = static_cast<size_t>(kSortLanes);
  return static_cast<size_t>(m) * per * 48 + static_cast<size_t>(nR + 8) * per * 8 +
         static_cast<size_t>(kRecordedSwapsMax) * per * 4 + 16 * 64;
}

}  // namespace detail
}  // namespace fast
}  // namespace asap
