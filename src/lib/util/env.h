// Environment variables that tune the library, read strictly: a value the
// variable does not take is one sentence naming it, not a silent default.
#pragma once
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "asap/error.h"

namespace asap {

// The value of `name` as a finite number of at least `lo` (a whole number
// when `whole`), or nothing when it is unset or empty. `expected` says what
// it takes, for the error.
inline std::optional<double> env_number(const char* name, double lo, bool whole, const char* expected) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v, &end);
  ASAP_CHECK(end != v && *end == '\0' && errno == 0 && std::isfinite(x) && x >= lo && (!whole || x == std::floor(x)),
             "environment variable ", name, ": expected ", expected, ", found '", v, "'");
  return x;
}

}  // namespace asap
