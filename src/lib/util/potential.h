// The 1-D Kantorovich potential of one slice evaluated off the sample
// points, shared by the reference features (features.cpp) and the fused
// path (fast/engine.cpp) so both extend it the same way.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

namespace asap {
namespace detail {

// phi(p) = p^2/2 - u(p) for sorted query projections xs, sorted key
// projections ys and the running u (u_0 = 0, u_{r+1} = u_r + ys_r (xs_{r+1} -
// xs_r)); u is extended by its outer rays.
inline double eval_potential(const std::vector<double>& xs, const std::vector<double>& ys, const std::vector<double>& u,
                             double p) {
  double up;
  if (p < xs.front()) {
    up = ys.front() * (p - xs.front());
  } else {
    // Last rank r with xs[r] <= p; the slope right of it is ys[r].
    const int64_t r = std::upper_bound(xs.begin(), xs.end(), p) - xs.begin() - 1;
    up = u[r] + ys[r] * (p - xs[r]);
  }
  return 0.5 * p * p - up;
}

}  // namespace detail
}  // namespace asap
