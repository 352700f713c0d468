#pragma once
#include <CLI/CLI.hpp>

#include <functional>

namespace asapc {
// Each adds its subcommand; `run` is set to the chosen command's body.
void add_inspect(CLI::App& app, std::function<int()>& run);
void add_compile(CLI::App& app, std::function<int()>& run);
void add_verify(CLI::App& app, std::function<int()>& run);
}  // namespace asapc
