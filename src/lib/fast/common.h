// Shared helpers of the fast path: kernel-table selection, aligned buffers.
#pragma once
#include <sys/mman.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>

#include "fast/fast.h"
#include "fast/kernels.h"

namespace asap {
namespace fast {
namespace detail {

// The kernel tables for `tuning` (see isa_for).
const Kernels& kernels_for(const Tuning& tuning);

template <class T>
const KernelTable<T>& table_of(const Kernels& k);
template <>
inline const KernelTable<float>& table_of<float>(const Kernels& k) {
  return k.f32;
}
template <>
inline const KernelTable<double>& table_of<double>(const Kernels& k) {
  return k.f64;
}

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Flush-to-zero and denormals-are-zero on this thread while in scope, the
// thread's own mode back after (x86's MXCSR bits 0x8040; nothing elsewhere).
// Every thread that runs heads holds one: the passes' plan entries reach
// FLT_MIN where a score is far below its row's maximum, and their products
// with the values are subnormal; on Intel cores each subnormal result or
// input costs a microcode assist (the fused teacher ran 8x slower on scores
// of +-800, padded text's, at n = 32; docs/performance.md, "Subnormals on
// Intel"). Results change only where an intermediate or an input is below
// FLT_MIN (1.2e-38; DBL_MIN in float64) in magnitude.
class FlushDenormals {
 public:
#if defined(__x86_64__) || defined(__i386__)
  static constexpr unsigned kBits = 0x8040;  // FTZ (bit 15) and DAZ (bit 6)
  FlushDenormals() : saved_(_mm_getcsr()) {
    if ((saved_ & kBits) != kBits) _mm_setcsr(saved_ | kBits);
  }
  ~FlushDenormals() {
    if ((saved_ & kBits) != kBits) _mm_setcsr(saved_);
  }

 private:
  unsigned saved_;
#else
  // Nothing to set; user-provided so that a guard is not an unused variable.
  FlushDenormals() {}
  ~FlushDenormals() {}
#endif
 public:
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;
};

// A 64-byte aligned, uninitialised, growable buffer.
template <class T>
class Buf {
 public:
  Buf() = default;
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  Buf(Buf&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  ~Buf() { std::free(p_); }
  // Ensures room for m elements; contents are not preserved. (The check
  // inlined, the growth not: a per-head call was a visible share of a head
  // at n = 17.)
  T* get(int64_t m) {
    if (__builtin_expect(m > n_, 0)) grow(m);
    return p_;
  }
  T* data() const { return p_; }

 private:
  __attribute__((noinline)) void grow(int64_t m) {
    std::free(p_);
    p_ = nullptr;
    n_ = 0;
    const size_t bytes = static_cast<size_t>(round_up(m * static_cast<int64_t>(sizeof(T)), 64));
    // Large buffers (score tiles) on 2 MiB boundaries with a transparent
    // huge page hint: fewer TLB misses in column passes. Harmless where
    // huge pages are unavailable.
    const size_t kHuge = size_t(2) << 20;
    if (bytes >= 2 * kHuge) {
      p_ = static_cast<T*>(std::aligned_alloc(kHuge, (bytes + kHuge - 1) / kHuge * kHuge));
#ifdef MADV_HUGEPAGE
      if (p_) madvise(p_, (bytes + kHuge - 1) / kHuge * kHuge, MADV_HUGEPAGE);
#endif
    } else {
      p_ = static_cast<T*>(std::aligned_alloc(64, bytes));
    }
    if (!p_) throw std::bad_alloc();
    n_ = m;
  }
  T* p_ = nullptr;
  int64_t n_ = 0;
};

}  // namespace detail
}  // namespace fast
}  // namespace asap
