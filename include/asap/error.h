// asap/error.h -- the one exception type for bad user input.
//
// User input (files, flags, tensors) never aborts: it throws asap::Error with
// one sentence naming the file, the field, what was expected and what was
// found. Invariants only a bug can break use ASAP_ASSERT.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace asap {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
inline void build(std::ostringstream&) {}
template <typename T, typename... R>
void build(std::ostringstream& os, const T& v, const R&... rest) {
  os << v;
  build(os, rest...);
}
}  // namespace detail

// Concatenates its arguments with operator<<.
template <typename... A>
std::string str(const A&... a) {
  std::ostringstream os;
  detail::build(os, a...);
  return os.str();
}

}  // namespace asap

// Throws asap::Error(str(...)) when cond is false.
#define ASAP_CHECK(cond, ...)                                   \
  do {                                                          \
    if (!(cond)) throw ::asap::Error(::asap::str(__VA_ARGS__)); \
  } while (0)

// Internal invariant; a failure is a bug in asapc, not bad input.
#define ASAP_ASSERT(cond)                                                                            \
  do {                                                                                               \
    if (!(cond))                                                                                     \
      throw std::logic_error(                                                                        \
          ::asap::str("internal error (a bug in asapc): ", #cond, " at ", __FILE__, ":", __LINE__)); \
  } while (0)
