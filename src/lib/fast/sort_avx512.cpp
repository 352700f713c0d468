// Lane-parallel sorting networks for AVX-512 (64-byte vectors: 16 float32
// keys or 8 packed float32 (key, position) words per register); the
// instruction set is chosen with `#pragma GCC target`, as in kernels_avx512.cpp.
#include "fast/isa_entry.h"
#include "fast/sort_network.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma")
#define ASAP_VBYTES 64
#define ASAP_SORT_NS sort_avx512
#define ASAP_ISA_NAME "avx512"
// GCC 12's AVX-512 extract/min/max intrinsics use _mm512_undefined_*(), which
// trips a spurious -W(maybe-)uninitialized (GCC bug 105593), as in kernels_avx512.cpp.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include "fast/sort_impl.h"
#pragma GCC diagnostic pop
#pragma GCC pop_options

ASAP_FAST_ISA_ENTRY(SortNetKernels, sortnet_avx512, &sort_avx512::kSortTable)
#else
ASAP_FAST_ISA_ENTRY(SortNetKernels, sortnet_avx512, nullptr)
#endif
