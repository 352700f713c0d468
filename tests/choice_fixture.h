// Candidate operators for the tests of compile's choice (test_compile.cpp,
// test_model_choice.cpp): a loop or an ASAP map with a given held-out error.
#pragma once
#include <string>

#include "compile/choose.h"

namespace asap_test {

// The teacher (T = steps) or Sinkhorn T' = steps.
inline asap::compile_detail::OperatorCandidate loop_op(asap::OperatorKind kind, int steps, double err) {
  asap::compile_detail::OperatorCandidate c;
  c.op.kind = kind;
  c.op.steps = steps;
  c.name = (kind == asap::OperatorKind::kTeacher ? "teacher T=" : "sinkhorn T'=") + std::to_string(steps);
  c.error = err;
  return c;
}

// An alpha (+ softmax) map with `slices` slices and k closures; its latency
// key is family and k.
inline asap::compile_detail::OperatorCandidate asap_op(int64_t slices, bool softmax, int k, double err) {
  asap::compile_detail::OperatorCandidate c;
  c.op.family.slices = slices;
  c.op.family.alpha = true;
  c.op.family.softmax_dual = softmax;
  c.op.closures = k;
  c.name = c.op.family.name() + " k=" + std::to_string(k);
  c.error = err;
  c.fit = 0;
  return c;
}

}  // namespace asap_test
