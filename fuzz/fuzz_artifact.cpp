// The artifact reader: asap::read_artifact on the input (HDF5 files with
// hostile shapes, types and attributes).
#include <ATen/core/Tensor.h>

#include "asap/artifact.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static asap_fuzz::InputFile file(".asap.h5");
  const std::string& path = file.write(data, size);
  asap_fuzz::expect_load_or_refuse("fuzz_artifact", [&] {
    asap::Artifact a = asap::read_artifact(path);
    for (const auto& L : a.layers) (void)L.describe();
  });
  return 0;
}
