// moekit-plot: the picture of a saved moekit-bench run (plot.h), or of a tuned layer
// (moekit-tune's measurements), without a GPU.
//   moekit-plot RUN.json [OUT.svg]     (default: RUN.svg next to the JSON)
//   moekit-plot --tune PARTIAL [--table TABLE] [--bench RUN.json [--op OP] [--workload W]]
//               [--title NAME] [OUT.svg]   (default: NAME.svg next to PARTIAL)
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "plot.h"

namespace {

const char* const kUsage =
    "usage: moekit-plot RUN.json [OUT.svg]\n"
    "       moekit-plot --tune PARTIAL [--table TABLE] [--bench RUN.json [--op OP] "
    "[--workload W]] [--title NAME] [OUT.svg]\n";

bool read_file(const std::string& path, std::string* text) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "moekit-plot: cannot read %s\n", path.c_str());
    return false;
  }
  std::ostringstream s;
  s << in.rdbuf();
  *text = s.str();
  return true;
}

// The --tune form's arguments; false (usage printed) when they are not.
bool parse_tune_args(const std::vector<std::string>& args, moekit::bench::TunePlotInputs* in,
                     std::string* out_path) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool has_value = i + 1 < args.size();
    if (a == "--tune" && has_value) {
      in->partial_name = args[++i];
    } else if (a == "--table" && has_value) {
      in->table_name = args[++i];
    } else if (a == "--bench" && has_value) {
      in->bench_name = args[++i];
    } else if (a == "--op" && has_value) {
      in->op = args[++i];
    } else if (a == "--workload" && has_value) {
      in->workload = args[++i];
    } else if (a == "--title" && has_value) {
      in->title = args[++i];
    } else if (a.rfind("--", 0) != 0 && out_path->empty()) {
      *out_path = a;
    } else {
      std::fprintf(stderr, "moekit-plot: unexpected argument '%s'\n%s", a.c_str(), kUsage);
      return false;
    }
  }
  if (in->partial_name.empty() || (in->bench_name.empty() && !(in->op + in->workload).empty())) {
    std::fprintf(stderr, "%s", kUsage);
    return false;
  }
  if (out_path->empty()) {
    const size_t slash = in->partial_name.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "" : in->partial_name.substr(0, slash + 1);
    *out_path = dir + moekit::bench::tune_layer_name(in->partial_name) + ".svg";
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  const bool tune = !args.empty() && args[0] == "--tune";
  if (args.empty() || args[0] == "--help" || (!tune && args.size() > 2)) {
    std::fprintf(stderr, "%s", kUsage);
    return 2;
  }
  std::string out_path, svg, in_path;
  try {
    if (tune) {
      moekit::bench::TunePlotInputs in;
      if (!parse_tune_args(args, &in, &out_path)) return 2;
      in_path = in.partial_name;
      if (!read_file(in.partial_name, &in.partial_text) ||
          (!in.table_name.empty() && !read_file(in.table_name, &in.table_text)) ||
          (!in.bench_name.empty() && !read_file(in.bench_name, &in.bench_text)))
        return 1;
      svg = moekit::bench::render_tune_svg(in);  // its errors name their file
    } else {
      in_path = args[0];
      out_path = args.size() == 2 ? args[1] : moekit::bench::svg_path_for(in_path);
      std::string text;
      if (!read_file(in_path, &text)) return 1;
      try {
        svg = moekit::bench::render_svg(text);
      } catch (const std::exception& e) {
        throw std::runtime_error(in_path + ": " + e.what());
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moekit-plot: %s\n", e.what());
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
