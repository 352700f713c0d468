// Batches of one split (training or held-out examples) built from the
// layer stream, cached in memory within a budget, else rebuilt on every
// pass: the iterative fits (KL, attention refit) pass over them many times.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "asap/features.h"
#include "asap/runtime.h"
#include "asap/teacher.h"
#include "io/layer_stream.h"

namespace asap {

// The reference features of a batch (what both iterative fits consume).
inline at::Tensor split_features(const HeadBatch& hb, const LayerSpec& s, const at::Tensor& theta,
                                 const FeatureFamily& family) {
  const auto c = convention_of(s);
  auto m = log_marginals(hb.mask, hb.q.size(0), hb.q.size(2), c.drop_padded_queries, hb.q.scalar_type(), hb.q.device());
  return build_features(hb.q, hb.k, m, theta, family, s.score_scale, s.eps);
}

template <class Batch>
class CachedSplit {
 public:
  using Build = std::function<Batch(const HeadBatch&)>;
  CachedSplit(const LayerStream& st, std::vector<int64_t> idx, int64_t batch, double cache_mb, Build build)
      : st_(st), idx_(std::move(idx)), batch_(batch), cache_mb_(cache_mb), build_(std::move(build)) {}

  void operator()(const std::function<void(const Batch&)>& fn) {
    if (cached_) {
      for (const auto& b : cache_) fn(b);
      return;
    }
    int64_t bytes = 0;
    bool keep = true;
    std::vector<Batch> fresh;
    for (size_t i = 0; i < idx_.size(); i += static_cast<size_t>(batch_)) {
      std::vector<int64_t> part(
          idx_.begin() + static_cast<std::ptrdiff_t>(i),
          idx_.begin() + static_cast<std::ptrdiff_t>(std::min(idx_.size(), i + static_cast<size_t>(batch_))));
      Batch b = build_(st_.read_indices(part));
      fn(b);
      bytes += b.bytes();
      keep = keep && bytes <= static_cast<int64_t>(cache_mb_ * 1048576.0);
      if (keep) fresh.push_back(std::move(b));
    }
    if (keep) {
      cache_ = std::move(fresh);
      cached_ = true;
    }
    cached_bytes_ = keep ? bytes : 0;
  }
  bool cached() const { return cached_; }
  int64_t cached_bytes() const { return cached_bytes_; }
  bool empty() const { return idx_.empty(); }

 private:
  const LayerStream& st_;
  std::vector<int64_t> idx_;
  int64_t batch_;
  double cache_mb_;
  Build build_;
  bool cached_ = false;
  int64_t cached_bytes_ = 0;
  std::vector<Batch> cache_;
};

}  // namespace asap
