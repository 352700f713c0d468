// Lane-parallel sorting networks for the baseline instruction set of the
// target (SSE2 on x86-64): 16-byte vectors. Always compiled; the fallback.
#include "fast/isa_entry.h"
#define ASAP_VBYTES 16
#define ASAP_SORT_NS sort_generic
#define ASAP_ISA_NAME "generic"
#include "fast/sort_impl.h"

ASAP_FAST_ISA_ENTRY(SortNetKernels, sortnet_generic, &sort_generic::kSortTable)
