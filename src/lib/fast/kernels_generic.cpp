// The fused kernels for the baseline instruction set of the target (SSE2 on
// x86-64, NEON on AArch64): 16-byte vectors. Always compiled; the fallback.
#include "fast/isa_entry.h"
#define ASAP_VBYTES 16
#define ASAP_ISA_NS isa_generic
#define ASAP_ISA_NAME "generic"
#define ASAP_NT_MR 4
#define ASAP_NT_NV 2
#define ASAP_NN_MR 4
#define ASAP_NN_NV 2
#include "fast/kernels_impl.h"

ASAP_FAST_ISA_ENTRY(Kernels, kernels_generic, &isa_generic::kTable)
