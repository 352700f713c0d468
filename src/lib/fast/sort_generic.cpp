// Lane-parallel sorting networks for the baseline instruction set of the
// target (SSE2 on x86-64): 16-byte vectors. Always compiled; the fallback.
#define ASAP_VBYTES 16
#define ASAP_SORT_NS sort_generic
#define ASAP_ISA_NAME "generic"
#include "fast/sort_impl.h"

namespace asap {
namespace fast {
namespace detail {
const SortNetKernels* sortnet_generic() { return &sort_generic::kSortTable; }
}  // namespace detail
}  // namespace fast
}  // namespace asap
