// asap/features.h -- dual features: sliced Kantorovich potentials and the
// cheap extra columns of asap-math.md sections 4 and 6b.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "asap/teacher.h"
#include "asap/types.h"

namespace asap {

// Slice bank Theta [d, L] float64 with unit-norm columns drawn from a seeded
// Gaussian. The generator is asapc's own (splitmix64 + Box-Muller), so a
// seed gives the same bank on every platform; the bank is stored in the
// artifact anyway.
at::Tensor make_slice_bank(int64_t d, int64_t L, uint64_t seed);

// The 1-D source potential of section 4 for the sorted matching of x to y
// (stable sorts, ties by index), as a function on the whole line.
class Potential1D {
 public:
  Potential1D(const double* x, const double* y, int64_t m);
  // phi at the i-th input point (uncentered), input order.
  const std::vector<double>& at_inputs() const { return phi_in_; }
  // phi(p) = p^2/2 - u(p), u extended by its outer rays.
  double operator()(double p) const;

 private:
  std::vector<double> xs_, ys_, u_, phi_in_;
};

// Sliced potential columns [B, H, n, L] (L = number of bank columns used,
// a prefix of theta), in q's dtype, centered over rows carrying mass, 0 on
// rows that carry none. Padded query rows that carry mass get the extended
// potential at their own projection.
at::Tensor sliced_potentials(const at::Tensor& q, const at::Tensor& k, const LogMarginals& m, const at::Tensor& theta,
                             int64_t L, double scale);

// The full feature matrix Psi [B, H, n, P] of a family, columns in the
// order of FeatureFamily. S (scores) is needed only for the softmax dual and
// may be passed to avoid recomputing it.
at::Tensor build_features(const at::Tensor& q, const at::Tensor& k, const LogMarginals& m, const at::Tensor& theta,
                          const FeatureFamily& family, double scale, double eps, const at::Tensor& S = at::Tensor());

}  // namespace asap
