// asapc: a thin command-line front end over libasap. Each subcommand lives
// in its own file; this one wires them up and maps errors to exit codes.
#include <CLI/CLI.hpp>

#include <iostream>

#include "asap/dist.h"
#include "asap/error.h"
#include "commands.h"
#include "common.h"

int main(int argc, char** argv) {
  CLI::App app{"asapc: compile Sinkhorn (Sinkformer) attention into amortized ASAP operators"};
  app.set_version_flag("--version", std::string("asapc ") + ASAP_VERSION_STRING_CLI);
  app.require_subcommand(1);
  std::function<int()> run;
  asapc::add_inspect(app, run);
  asapc::add_compile(app, run);
  asapc::add_verify(app, run);
  try {
    asapc::refuse_empty_values(argc, argv);
  } catch (const asap::Error& e) {
    std::cerr << "asapc: error: " << e.what() << "\n";
    return asapc::kExitBadInput;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One sentence, as for every other bad input.
    std::cerr << "asapc: error: " << e.what() << " (see asapc "
              << (app.get_subcommands().empty() ? std::string() : app.get_subcommands()[0]->get_name() + " ")
              << "--help)\n";
    return asapc::kExitBadInput;
  }
  try {
    return run();
  } catch (const asap::Error& e) {
    // In a process group, the other ranks stop too, naming this one.
    if (auto* comm = asap::active_communicator()) comm->report_failure(e.what());
    std::cerr << "asapc: error: " << e.what() << "\n";
    return asapc::kExitBadInput;
  } catch (const std::exception& e) {
    if (auto* comm = asap::active_communicator()) comm->report_failure(std::string("internal error: ") + e.what());
    std::cerr << "asapc: internal error: " << e.what() << "\n";
    return 3;
  }
}
