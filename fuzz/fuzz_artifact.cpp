// The artifact reader: asap::read_artifact on the input (HDF5 files with
// hostile shapes, types and attributes).
#include <ATen/core/Tensor.h>

#include <H5public.h>
#include "asap/artifact.h"

#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const asap_fuzz::InputFile file(data, size, ".asap.h5");  // a fresh path per input
  const std::string& path = file.path();
  asap_fuzz::expect_load_or_refuse("fuzz_artifact", [&] {
    asap::Artifact a = asap::read_artifact(path);
    for (const auto& L : a.layers) (void)L.describe();
  });
  H5garbage_collect();  // free HDF5's free lists: no state carried to the next input
  return 0;
}
