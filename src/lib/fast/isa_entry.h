// The entry point of one per-ISA file (kernels_<isa>.cpp, sort_<isa>.cpp):
// `const TYPE* FN()` in asap::fast::detail, returning VALUE -- the file's
// table, or nullptr where the instruction set is not compiled on this
// target. fast/dispatch.cpp and sort_network.cpp pick among them.
#pragma once

#define ASAP_FAST_ISA_ENTRY(TYPE, FN, VALUE) \
  namespace asap {                           \
  namespace fast {                           \
  namespace detail {                         \
  const TYPE* FN() { return VALUE; }         \
  }                                          \
  }                                          \
  }
