// Compile phase "fits": ridge and slice prefix per candidate family and
// pooling, from the held-out statistics alone.
#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "asap/error.h"
#include "compile/phases.h"

namespace asap {
namespace compile_detail {

using nlohmann::json;

FeatureFamily family_of(const std::string& features, int64_t slices) {
  std::string rest = features;
  FeatureFamily f;
  if (rest.rfind("slices", 0) == 0) {
    f.slices = slices;
    rest = rest.substr(6);
    if (!rest.empty() && rest[0] == '+') rest = rest.substr(1);
  }
  if (rest.empty() && features == "slices") return f;
  // "+stats": the score_stats columns; "+cstats": those and the centered_stats ones.
  for (const char* sfx : {"+stats", "+cstats"}) {
    const std::string suffix = sfx;
    if (rest.size() > suffix.size() && rest.compare(rest.size() - suffix.size(), std::string::npos, suffix) == 0) {
      f.score_stats = true;
      f.centered_stats = suffix == "+cstats";
      rest.resize(rest.size() - suffix.size());
      break;
    }
  }
  if (rest == "alpha") {
    f.alpha = true;
  } else if (rest == "alpha+softmax") {
    f.alpha = f.softmax_dual = true;
  } else if (rest == "alpha+softmax+sinkhorn3") {
    f.alpha = f.softmax_dual = f.sinkhorn_dual3 = true;
  } else {
    throw Error(str("unknown feature set '", features,
                    "': expected slices, slices+alpha, slices+alpha+softmax, slices+alpha+softmax+sinkhorn3, "
                    "alpha, alpha+softmax or alpha+softmax+sinkhorn3, each of the alpha families optionally "
                    "followed by +stats or +cstats"));
  }
  return f;
}

bool family_has_slices(const std::string& features) { return features.rfind("slices", 0) == 0; }

std::string Fit::name() const {
  return cand.features + (cand.per_head ? "/per-head" : "/pooled") + "@L" + std::to_string(family.slices) +
         (target_k > 0 ? "->k" + std::to_string(target_k) : "");
}

FitTable fit_candidates(const Statistics& st, const FeatureFamily& widest, const std::vector<Candidate>& candidates,
                        const std::vector<int64_t>& slice_counts, const std::vector<double>& grid,
                        const FitOptions& opt, bool can_select) {
  FitTable out;
  // The closure-ready target, then each k-matched one (docs/decisions.md).
  struct Target {
    int k;
    const LsStats *train, *held;
  };
  std::vector<Target> targets;
  if (opt.targets != Targets::kKMatched || st.matched.empty()) targets.push_back({0, &st.train, &st.held});
  for (const auto& m : st.matched)
    if (!m.train.empty()) targets.push_back({m.k, &m.train, &m.held});
  for (const auto& tg : targets)
    for (const auto& cand : candidates) {
      const LsStats& train = *tg.train;
      const LsStats& held = *tg.held;
      const bool reference = cand.features == "slices" && !cand.per_head;  // the paper's map
      std::vector<SlicePrefixRecord> table;
      double best = std::numeric_limits<double>::infinity();
      std::vector<int64_t> counts;
      if (family_has_slices(cand.features)) {
        for (int64_t L : slice_counts)
          if (family_of(cand.features, L).num_columns() > 0) counts.push_back(L);
      } else {
        counts.push_back(0);
      }
      std::vector<Fit> kept;
      for (int64_t L : counts) {
        Fit f;
        f.cand = cand;
        f.family = family_of(cand.features, L);
        f.cols = family_columns(widest, f.family);
        f.reference_map = reference && tg.k == 0;
        f.target_k = tg.k;
        SlicePrefixRecord row;
        row.slices = L;
        if (opt.ridge >= 0 || !can_select) {
          f.lambda = opt.ridge >= 0 ? opt.ridge : 1e-3;
          if (can_select) f.dual_mse = ls_mse(held, f.cols, solve_ls(train, f.cols, cand.per_head, f.lambda));
        } else {
          auto rc = choose_ridge(train, held, f.cols, cand.per_head, grid);
          f.lambda = rc.lambda;
          f.dual_mse = rc.heldout_mse;
          row.ridge_grid = rc.grid;
          row.ridge_grid_mse = rc.grid_mse;
        }
        row.ridge = f.lambda;
        row.heldout_dual_mse = f.dual_mse;
        if (can_select && std::isnan(f.dual_mse)) out.nan_fits.push_back(f.name());
        // Nested prefixes: a larger one must beat every smaller one by 1% to
        // be worth its latency (and by more than rounding). Without held-out data only the largest is kept.
        bool keep;
        if (!can_select) {
          keep = L == counts.back();
        } else {
          // Below the tie (ls_mse_tie) a difference is rounding, not a gain.
          keep = std::isfinite(f.dual_mse) && (kept.empty() || f.dual_mse < best * 0.99 - ls_mse_tie(held));
          // The paper's map keeps only its best prefix: it is the reference row, not a contender.
          if (f.reference_map && keep) kept.clear();
        }
        row.kept = keep;
        table.push_back(row);
        if (keep) {
          best = std::min(best, f.dual_mse);
          kept.push_back(std::move(f));
        }
      }
      for (auto& f : kept) {
        f.coef = solve_ls(train, f.cols, cand.per_head, f.lambda);
        out.fits.push_back(std::move(f));
      }
      out.slice_tables.push_back(
          {cand.features + (cand.per_head ? "/per-head" : "/pooled") + (tg.k > 0 ? "->k" + std::to_string(tg.k) : ""),
           std::move(table)});
    }
  return out;
}

}  // namespace compile_detail

bool is_feature_family(const std::string& features) {
  try {
    compile_detail::family_of(features, 1);
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace asap
