// The calibration reader: asap::CalibFile on the input, then every layer read
// in bounded batches, as compile streams it.
#include <ATen/core/Tensor.h>

#include <algorithm>

#include <H5public.h>
#include "asap/calib.h"

#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const asap_fuzz::InputFile file(data, size, ".h5");  // a fresh path per input
  const std::string& path = file.path();
  asap_fuzz::expect_load_or_refuse("fuzz_calib", [&] {
    asap::CalibFile cf(path);
    for (const std::string& name : cf.layer_names()) {
      const asap::CalibFile::LayerInfo li = cf.info(name);
      // Bounded batches of at most 64 examples; at most 16 batches per layer
      // so that a valid but large file cannot stall the fuzzer.
      int64_t batches = 0;
      for (int64_t s = 0; s < li.N && batches < 16; s += 64, ++batches) {
        asap::CalibBatch b = cf.read(name, s, std::min<int64_t>(64, li.N - s));
        (void)b;
      }
    }
  });
  H5garbage_collect();  // free HDF5's free lists: no state carried to the next input
  return 0;
}
