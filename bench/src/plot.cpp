#include "plot.h"

#include "plot_run.h"

namespace moekit::bench {

std::string render_svg(const std::string& json_text) {
  const plot::Run run = plot::parse_run(json_text);
  return run.tokens_run ? plot::tokens_figure(run) : plot::ops_figure(run);
}

std::string svg_path_for(const std::string& json_path) {
  const std::string ext = ".json";
  if (json_path.size() > ext.size() &&
      json_path.compare(json_path.size() - ext.size(), ext.size(), ext) == 0)
    return json_path.substr(0, json_path.size() - ext.size()) + ".svg";
  return json_path + ".svg";
}

}  // namespace moekit::bench
