// The teacher spec parser: asap::read_spec on the input as a JSON file.
#include "asap/spec.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const asap_fuzz::InputFile file(data, size, ".spec.json");  // a fresh path per input
  const std::string& path = file.path();
  asap_fuzz::expect_load_or_refuse("fuzz_spec", [&] {
    asap::TeacherSpec s = asap::read_spec(path);
    (void)s;
  });
  return 0;
}
