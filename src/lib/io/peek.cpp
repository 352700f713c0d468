#include <H5Cpp.h>

#include <fstream>

#include "asap/artifact.h"
#include "io/h5util.h"

namespace asap {

std::string hdf5_format_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[8] = {};
  if (!in.read(magic, 8) || std::string(magic, 8) != std::string("\x89HDF\r\n\x1a\n", 8)) return "";
  detail::h5::Where w{"file '" + path + "'", "/"};
  try {
    auto f = detail::h5::open_file(path, w);
    if (!detail::h5::has_attr(f, "format")) return "";
    return detail::h5::read_string_attr(f, "format", w);
  } catch (const Error&) {
    return "";
  }
}

}  // namespace asap
