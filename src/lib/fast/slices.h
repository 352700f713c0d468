// The slice projections shared by the fused ASAP call (engine.cpp, api.cpp)
// and ESP attention (esp.cpp): the scaled direction bank and the projection
// of a head's queries and keys onto it.
#pragma once
#include <ATen/core/Tensor.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "fast/common.h"
#include "fast/sort_network.h"

namespace asap {
namespace fast {
namespace detail {

// The slice bank of a call in the two layouts the engine reads, rounded
// like the reference (theta cast to T, then multiplied by sqrt(scale) in T):
// rows [L, d] (scalar sorts) and transposed [d][round_up(L, kSortLanes)],
// zero past L (lane-parallel networks). Built once per call, shared by
// every head; read straight from a CPU float64 contiguous bank (what
// artifacts hold), so no ATen operator runs.
template <class T>
struct ScaledBank {
  std::vector<T> rows, cols;
  ScaledBank(const at::Tensor& theta, int64_t L, double scale) {
    if (L <= 0) return;
    at::Tensor th = theta;
    if (!(th.device().is_cpu() && th.scalar_type() == at::kDouble && th.is_contiguous()))
      th = theta.to(at::kCPU, at::kDouble).contiguous();
    const int64_t d = th.size(0), stored = th.size(1), Lp = round_up(L, kSortLanes);
    const double* p = th.data_ptr<double>();
    const T s = static_cast<T>(std::sqrt(scale));
    rows.resize(static_cast<size_t>(L * d));
    cols.assign(static_cast<size_t>(d * Lp), T(0));
    for (int64_t i = 0; i < d; ++i)
      for (int64_t l = 0; l < L; ++l) {
        const T v = static_cast<T>(p[i * stored + l]) * s;
        rows[l * d + i] = v;
        cols[i * Lp + l] = v;
      }
  }
};

// X[l, r] = <bank_l, q_r> (l < L, r < nq; leading dimension ldx) and
// Y[l, r] = <bank_l, k_r> (r < nk; ldy): both sides packed once, one GEMM
// each. pq and pk hold ldx * d and ldy * d elements (ldx, ldy multiples of
// the table's nt_nr).
template <class T>
void project_slices(const KernelTable<T>& kt, int64_t L, int64_t d, const T* bank, int64_t nq, const T* q, int64_t nk,
                    const T* k, T* pq, T* pk, T* X, int64_t ldx, T* Y, int64_t ldy) {
  kt.pack_b(nq, d, q, d, T(1), pq);
  kt.pack_b(nk, d, k, d, T(1), pk);
  kt.gemm_nt(L, nq, d, bank, d, pq, X, ldx);
  kt.gemm_nt(L, nk, d, bank, d, pk, Y, ldy);
}

}  // namespace detail
}  // namespace fast
}  // namespace asap
