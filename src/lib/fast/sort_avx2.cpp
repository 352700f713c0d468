// Lane-parallel sorting networks for AVX2 + FMA (32-byte vectors); the
// instruction set is chosen with `#pragma GCC target`, as in kernels_avx2.cpp.
#include "fast/isa_entry.h"
#include "fast/sort_network.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define ASAP_VBYTES 32
#define ASAP_SORT_NS sort_avx2
#define ASAP_ISA_NAME "avx2"
#include "fast/sort_impl.h"
#pragma GCC pop_options

ASAP_FAST_ISA_ENTRY(SortNetKernels, sortnet_avx2, &sort_avx2::kSortTable)
#else
ASAP_FAST_ISA_ENTRY(SortNetKernels, sortnet_avx2, nullptr)
#endif
