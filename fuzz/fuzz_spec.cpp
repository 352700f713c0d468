// The teacher spec parser: asap::read_spec on the input as a JSON file.
#include "asap/spec.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static asap_fuzz::InputFile file(".spec.json");
  const std::string& path = file.write(data, size);
  asap_fuzz::expect_load_or_refuse("fuzz_spec", [&] { asap::TeacherSpec s = asap::read_spec(path); (void)s; });
  return 0;
}
