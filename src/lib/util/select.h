// Choosing layers by name (compile's and verify's --layers): all of them
// when no name is given, else the named ones in the order given, each found
// by its name; a name with no layer is refused with the caller's sentence.
#pragma once
#include <string>
#include <vector>

#include "asap/error.h"

namespace asap {
namespace detail {

template <class T, class NameOf, class Missing>
std::vector<const T*> select_by_name(const std::vector<T>& all, const std::vector<std::string>& names, NameOf name_of,
                                     Missing missing) {
  std::vector<const T*> out;
  if (names.empty()) {
    for (const auto& x : all) out.push_back(&x);
    return out;
  }
  for (const auto& n : names) {
    const T* hit = nullptr;
    for (const auto& x : all)
      if (name_of(x) == n) {
        hit = &x;
        break;
      }
    if (!hit) throw Error(missing(n));
    out.push_back(hit);
  }
  return out;
}

}  // namespace detail
}  // namespace asap
