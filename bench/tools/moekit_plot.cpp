// moekit-plot: the picture of a saved moekit-bench run (plot.h), without a GPU.
//   moekit-plot RUN.json [OUT.svg]     (default: RUN.svg next to the JSON)
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "plot.h"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3 || std::string(argv[1]) == "--help") {
    std::fprintf(stderr, "usage: moekit-plot RUN.json [OUT.svg]\n");
    return 2;
  }
  const std::string in_path = argv[1];
  const std::string out_path = argc == 3 ? argv[2] : moekit::bench::svg_path_for(in_path);
  std::ifstream in(in_path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "moekit-plot: cannot read %s\n", in_path.c_str());
    return 1;
  }
  std::ostringstream text;
  text << in.rdbuf();
  std::string svg;
  try {
    svg = moekit::bench::render_svg(text.str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moekit-plot: %s: %s\n", in_path.c_str(), e.what());
    return 1;
  }
  std::ofstream out(out_path, std::ios::binary);
  if (!(out << svg)) {
    std::fprintf(stderr, "moekit-plot: cannot write %s\n", out_path.c_str());
    return 1;
  }
  std::printf("%s\n", out_path.c_str());
  return 0;
}
