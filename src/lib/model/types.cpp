// The core types' few functions (asap/types.h).
#include "asap/types.h"

#include "asap/error.h"

namespace asap {

std::string FeatureFamily::name() const {
  std::string s;
  auto add = [&](const std::string& part) { s += (s.empty() ? "" : "+") + part; };
  if (slices > 0) add(asap::str("L", slices));
  if (alpha) add("alpha");
  if (softmax_dual) add("softmax");
  if (sinkhorn_dual3) add("sinkhorn3");
  if (centered_stats)
    add("cstats");  // the five columns of score_stats and centered_stats
  else if (score_stats)
    add("stats");
  return s.empty() ? "empty" : s;
}

const char* operator_kind_name(OperatorKind k) {
  switch (k) {
    case OperatorKind::kAsap:
      return "asap";
    case OperatorKind::kSinkhorn:
      return "sinkhorn";
    case OperatorKind::kTeacher:
      return "teacher";
  }
  return "?";
}

int lse_passes(const FeatureFamily& f, int closures) { return closures + f.feature_passes(); }

int CompiledLayer::lse_passes() const {
  switch (kind) {
    case OperatorKind::kSinkhorn:
      return sinkhorn_steps;
    case OperatorKind::kTeacher:
      return spec.T;
    case OperatorKind::kAsap:
      break;
  }
  return family.feature_passes() + default_closures;
}

std::string CompiledLayer::describe() const {
  switch (kind) {
    case OperatorKind::kSinkhorn:
      return asap::str("sinkhorn T'=", sinkhorn_steps);
    case OperatorKind::kTeacher:
      return asap::str("teacher T=", spec.T);
    case OperatorKind::kAsap:
      break;
  }
  return asap::str("asap ", family.name(), per_head ? "/head" : "/pooled", " k=", default_closures);
}

}  // namespace asap
