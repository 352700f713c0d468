// The fused kernels for AVX2 + FMA (32-byte vectors), selected at run time
// when the CPU has them. `#pragma GCC target` instead of per-file CMake flags
// keeps the build files untouched; kernels_impl.h includes no
// standard-library inline code, so nothing compiled here can be picked by
// the linker for code running on an older CPU.
#include "fast/isa_entry.h"
#include "fast/kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define ASAP_VBYTES 32
#define ASAP_ISA_NS isa_avx2
#define ASAP_ISA_NAME "avx2"
#define ASAP_NT_MR 6
#define ASAP_NT_NV 2
#define ASAP_NN_MR 6
#define ASAP_NN_NV 2
#include "fast/kernels_impl.h"
#pragma GCC pop_options

ASAP_FAST_ISA_ENTRY(Kernels, kernels_avx2, &isa_avx2::kTable)
#else
ASAP_FAST_ISA_ENTRY(Kernels, kernels_avx2, nullptr)
#endif
