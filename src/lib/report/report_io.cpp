// Writing the report files; the page itself is rendered by html_report.cpp.
#include "asap/report.h"
#include "util/atomic_file.h"

namespace asap {

void write_report(const nlohmann::json& v, const std::string& html_path, const std::string& json_path,
                  const std::string& title, const std::string& note) {
  if (!json_path.empty()) write_file_atomically(json_path, v.dump(1) + "\n");
  if (!html_path.empty()) write_file_atomically(html_path, render_html_report(v, title, note));
}

}  // namespace asap
