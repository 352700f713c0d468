// The fused kernels for AVX-512 (64-byte vectors, 32 registers), selected at
// run time when the CPU and OS support it. See kernels_avx2.cpp for why the
// instruction set is chosen with `#pragma GCC target`.
#include "fast/isa_entry.h"
#include "fast/kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma")
#define ASAP_VBYTES 64
#define ASAP_ISA_NS isa_avx512
#define ASAP_ISA_NAME "avx512"
#define ASAP_NT_MR 6
#define ASAP_NT_NV 4
#define ASAP_NN_MR 6
#define ASAP_NN_NV 4
// GCC 12's _mm512_{min,max}_p* use _mm512_undefined_p*(), which trips a
// spurious -W(maybe-)uninitialized (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include "fast/kernels_impl.h"
#pragma GCC diagnostic pop
#pragma GCC pop_options

ASAP_FAST_ISA_ENTRY(Kernels, kernels_avx512, &isa_avx512::kTable)
#else
ASAP_FAST_ISA_ENTRY(Kernels, kernels_avx512, nullptr)
#endif
