// Argument parsing shared by the standalone experiment programs in this
// folder (each is compiled alone by its .sh script).
#pragma once

#include <cstdio>
#include <cstdlib>

// s as a positive integer, or one sentence naming the program and the
// argument, and exit 2.
inline long positive_arg(const char* prog, const char* s, const char* what) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (!*s || *end || v < 1) {
    std::fprintf(stderr, "%s: expected %s as a positive integer, found '%s'\n", prog, what, s);
    std::exit(2);
  }
  return v;
}
