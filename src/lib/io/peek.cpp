#include <H5Cpp.h>

#include <fstream>

#include "asap/artifact.h"
#include "asap/calib.h"
#include "io/h5util.h"

namespace asap {

std::string hdf5_format_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[8] = {};
  if (!in.read(magic, 8) || std::string(magic, 8) != std::string("\x89HDF\r\n\x1a\n", 8)) return "";
  // An HDF5 file from here on: a file HDF5 cannot open is reported as a
  // damaged HDF5 file (not handed to the checkpoint reader).
  detail::h5::Where w{"file '" + path + "'", "/"};
  auto f = detail::h5::open_file(path, w);
  if (!detail::h5::has_attr(f, "format")) return "";
  // A variable-length 'format' is not read (docs/decisions.md): the reader
  // its version attribute points to refuses the file in its own words.
  if (detail::h5::is_vlen_string_attr(f, "format")) {
    if (detail::h5::has_attr(f, "format_version")) return kArtifactFormat;
    if (detail::h5::has_attr(f, "version")) return kCalibFormat;
  }
  return detail::h5::read_string_attr(f, "format", w);
}

}  // namespace asap
