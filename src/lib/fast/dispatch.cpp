// Run-time choice of the kernels' instruction set.
#include <ATen/Config.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "asap/error.h"
#include "fast/common.h"

// With LibTorch's OpenMP backend, at::parallel_for is inline code around
// `#pragma omp parallel`: it only runs in parallel in translation units
// compiled with OpenMP. Say so at build time rather than run serially unseen.
#if AT_PARALLEL_OPENMP && !defined(_OPENMP)
#pragma message( \
    "asap fast path built without OpenMP: at::parallel_for will run serially. Link the asap target with OpenMP::OpenMP_CXX (adds -fopenmp).")
#endif

namespace asap {
namespace fast {

bool parallel_build() {
#if AT_PARALLEL_OPENMP && !defined(_OPENMP)
  return false;
#else
  return true;
#endif
}

namespace {

bool cpu_has(const std::string& isa) {
  if (isa == "generic") return true;
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  // libgcc's checks include the OS saving the wider registers (XGETBV).
  if (isa == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (isa == "avx512")
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx2") &&
           __builtin_cpu_supports("fma");
#endif
  return false;
}

const detail::Kernels* compiled(const std::string& isa) {
  if (isa == "generic") return detail::kernels_generic();
  if (isa == "avx2") return detail::kernels_avx2();
  if (isa == "avx512") return detail::kernels_avx512();
  return nullptr;
}

}  // namespace

std::vector<std::string> available_isas() {
  std::vector<std::string> out;
  for (const char* isa : {"generic", "avx2", "avx512"})
    if (compiled(isa) && cpu_has(isa)) out.push_back(isa);
  return out;
}

std::string isa_for(const Tuning& tuning) {
  std::string want = tuning.isa;
  const char* from = "fast kernels";
  if (want.empty()) {
    const char* env = std::getenv("ASAP_FAST_ISA");
    if (env && *env) want = env, from = "environment variable ASAP_FAST_ISA";
  }
  const auto have = available_isas();
  if (want.empty()) return have.back();
  for (const auto& h : have)
    if (h == want) return want;
  std::string list;
  for (const auto& h : have) list += (list.empty() ? "" : ", ") + h;
  throw Error(str(from, ": instruction set '", want, "' is not available here (available: ", list, ")"));
}

namespace detail {
const Kernels& kernels_for(const Tuning& tuning) {
  // The common case (no override) is resolved once.
  if (tuning.isa.empty()) {
    static const Kernels* best = compiled(isa_for(Tuning{}));
    return *best;
  }
  return *compiled(isa_for(tuning));
}
}  // namespace detail

}  // namespace fast
}  // namespace asap
