// Whole checkpoint load (format detection, zip reader, restricted unpickler,
// tensor materialization): asap::load_checkpoint on the input as a file.
#include <ATen/core/Tensor.h>

#include "asap/checkpoint.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const asap_fuzz::InputFile file(data, size, ".pt");  // a fresh path per input
  const std::string& path = file.path();
  asap_fuzz::expect_load_or_refuse("fuzz_checkpoint", [&] {
    asap::Checkpoint ck = asap::load_checkpoint(path);
    // Touch every tensor: sizes and bytes must be what the loader promised.
    for (const auto& name : ck.names) {
      const at::Tensor& t = ck.get(name);
      if (t.numel() > 0 && !t.is_contiguous()) std::abort();
    }
  });
  return 0;
}
