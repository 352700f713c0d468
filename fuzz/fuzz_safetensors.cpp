// safetensors: the header parser on the raw bytes, then the whole load
// (asap::load_checkpoint detects the format from the bytes).
#include <ATen/core/Tensor.h>

#include "asap/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  asap_fuzz::expect_load_or_refuse("fuzz_safetensors", [&] {
    if (!asap::detail::looks_like_safetensors(data, size)) return;
    auto entries = asap::detail::parse_safetensors(data, size, "fuzz input");
    for (const auto& e : entries)
      if (e.begin > e.end || e.end > size) std::abort();  // the parser promises in-bounds offsets
  });
  const asap_fuzz::InputFile file(data, size, ".safetensors");  // a fresh path per input
  const std::string& path = file.path();
  asap_fuzz::expect_load_or_refuse("fuzz_safetensors", [&] {
    asap::Checkpoint ck = asap::load_checkpoint(path);
    for (const auto& name : ck.names) (void)ck.get(name).numel();
  });
  return 0;
}
