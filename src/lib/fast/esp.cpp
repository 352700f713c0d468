// ESP hard-sort attention (asap-math.md section 8): the benchmark's sorting
// baseline, run with the same packed GEMM and radix sort as the features.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

#include "asap/error.h"
#include "fast/common.h"
#include "fast/fast.h"
#include "fast/slices.h"
#include "fast/sort.h"

namespace asap {
namespace fast {

namespace {

template <class T>
void esp_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& theta, double scale,
              double tau, const Tuning& tuning, at::Tensor& O) {
  using namespace detail;
  const int64_t B = q.size(0), H = q.size(1), n = q.size(2), d = q.size(3), dv = v.size(3);
  const int64_t L = theta.size(1);
  const auto& kt = table_of<T>(kernels_for(tuning));
  const int64_t NR = kt.nt_nr, ldx = round_up(n, NR);
  const ScaledBank<T> bank(theta, L, scale);
  const T* qp = q.data_ptr<T>();
  const T* kp = k.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  T* op = O.data_ptr<T>();
  at::parallel_for(0, B * H, 1, [&](int64_t b0, int64_t b1) {
    const FlushDenormals ftz;
    Buf<T> packq, packk, X, Y;
    SortScratch<T> ss_;
    std::vector<int32_t> ox, oy;
    std::vector<int32_t> sigma(L * n);
    std::vector<double> D(L), aq(n), ak(n);
    for (int64_t bh = b0; bh < b1; ++bh) {
      const T* qh = qp + bh * n * d;
      const T* kh = kp + bh * n * d;
      const T* vh = vp + bh * n * dv;
      T* pq = packq.get(ldx * d);
      T* pk = packk.get(ldx * d);
      T* x = X.get(L * ldx);
      T* y = Y.get(L * ldx);
      project_slices(kt, L, d, bank.rows.data(), n, qh, n, kh, pq, pk, x, ldx, y, ldx);
      for (int64_t i = 0; i < n; ++i) {
        double sq = 0, sk = 0;
        for (int64_t c = 0; c < d; ++c) {
          sq += static_cast<double>(qh[i * d + c]) * qh[i * d + c];
          sk += static_cast<double>(kh[i * d + c]) * kh[i * d + c];
        }
        aq[i] = 0.5 * scale * sq;
        ak[i] = 0.5 * scale * sk;
      }
      double dmin = 0;
      for (int64_t l = 0; l < L; ++l) {
        const T* xl = x + l * ldx;
        const T* yl = y + l * ldx;
        sort_order<T>(
            n, [&](int64_t r) { return xl[r]; }, ss_, ox);
        sort_order<T>(
            n, [&](int64_t r) { return yl[r]; }, ss_, oy);
        int32_t* sg = sigma.data() + l * n;
        double cost = 0;
        for (int64_t r = 0; r < n; ++r) {
          const int64_t i = ox[r], j = oy[r];
          sg[i] = static_cast<int32_t>(j);
          const T* a = qh + i * d;
          const T* b = kh + j * d;
          T acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
          int64_t c = 0;
          for (; c + 8 <= d; c += 8)
            for (int u = 0; u < 8; ++u) acc[u] += a[c + u] * b[c + u];
          T dot = 0;
          for (int u = 0; u < 8; ++u) dot += acc[u];
          for (; c < d; ++c) dot += a[c] * b[c];
          cost += aq[i] + ak[j] - scale * static_cast<double>(dot);
        }
        D[l] = cost / static_cast<double>(n);
        dmin = l == 0 ? D[l] : std::min(dmin, D[l]);
      }
      // w = softmax(-tau D), shifted by the smallest cost.
      std::vector<T> w(L);
      double wsum = 0;
      for (int64_t l = 0; l < L; ++l) wsum += std::exp(-tau * (D[l] - dmin));
      for (int64_t l = 0; l < L; ++l) w[l] = static_cast<T>(std::exp(-tau * (D[l] - dmin)) / wsum);
      T* oh = op + bh * n * dv;
      for (int64_t i = 0; i < n * dv; ++i) oh[i] = T(0);
      for (int64_t l = 0; l < L; ++l) {
        const int32_t* sg = sigma.data() + l * n;
        const T wl = w[l];
        for (int64_t i = 0; i < n; ++i) {
          const T* src = vh + static_cast<int64_t>(sg[i]) * dv;
          T* dst = oh + i * dv;
          for (int64_t c = 0; c < dv; ++c) dst[c] += wl * src[c];
        }
      }
    }
  });
}

}  // namespace

at::Tensor esp_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& theta,
                         double scale, double tau, const Tuning& tuning) {
  ASAP_CHECK(handles(q) && k.device().is_cpu() && v.device().is_cpu(),
             "ESP attention: CPU float32/float64 tensors only");
  ASAP_CHECK(q.dim() == 4 && k.sizes() == q.sizes(), "ESP attention: q and k must be [B, H, n, d] with equal shapes");
  ASAP_CHECK(v.dim() == 4 && v.size(0) == q.size(0) && v.size(1) == q.size(1) && v.size(2) == q.size(2),
             "ESP attention: v must be [B, H, n, dv]");
  ASAP_CHECK(theta.dim() == 2 && theta.size(0) == q.size(3) && theta.size(1) >= 1,
             "ESP attention: theta must be [d, L], found ", theta.sizes());
  auto qc = q.contiguous();
  auto kc = k.to(q.scalar_type()).contiguous();
  auto vc = v.to(q.scalar_type()).contiguous();
  at::Tensor O = at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
  if (q.size(2) == 0) return O;
  if (q.scalar_type() == at::kFloat)
    esp_impl<float>(qc, kc, vc, theta, scale, tau, tuning, O);
  else
    esp_impl<double>(qc, kc, vc, theta, scale, tau, tuning, O);
  return O;
}

}  // namespace fast
}  // namespace asap
