// asapc: a thin command-line front end over libasap.
#include <CLI/CLI.hpp>

#include <iostream>

#include "asap/error.h"

int main(int argc, char** argv) {
  CLI::App app{"asapc: compile Sinkhorn attention into amortized ASAP operators"};
  app.set_version_flag("--version", std::string("asapc ") + ASAP_VERSION_STRING_CLI);
  app.require_subcommand(1);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
