#include "ceilings.h"

#include <sys/stat.h>

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>

namespace moekit::bench {

namespace {

std::string today() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

void mkdirs(const std::string& path) {
  for (size_t i = 1; i < path.size(); ++i)
    if (path[i] == '/') mkdir(path.substr(0, i).c_str(), 0755);
}

}  // namespace

std::string ceilings_cache_path(const std::string& explicit_path, const Device& dev) {
  if (!explicit_path.empty()) return explicit_path;
  if (const char* e = std::getenv("MOEKIT_BENCH_CACHE"); e && *e) return e;
  std::string dir;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    dir = std::string(x) + "/moekit";
  else if (const char* h = std::getenv("HOME"); h && *h)
    dir = std::string(h) + "/.cache/moekit";
  else
    dir = "/tmp/moekit";
  return dir + "/ceilings-" + dev.uuid + ".json";
}

Ceilings get_ceilings(const Device& dev, Blas& blas, const std::string& path, bool remeasure,
                      cudaStream_t s) {
  using nlohmann::json;
  if (!remeasure) {
    std::ifstream in(path);
    if (in) {
      try {
        json j = json::parse(in);
        if (j.value("uuid", "") == dev.uuid && j.value("name", "") == dev.name) {
          Ceilings c;
          c.read_tbps = j.at("read_tbps").get<double>();
          c.bf16_tflops = j.at("bf16_tflops").get<double>();
          c.fp8_tflops = j.at("fp8_tflops").get<double>();
          c.source = "measured " + j.value("date", std::string("?")) + ", cached in " + path;
          return c;
        }
      } catch (const std::exception&) {
        // unreadable cache: measure again
      }
    }
  }
  std::string failed;
  Ceilings c = measure_ceilings(dev, blas, s, &failed);
  if (!failed.empty()) {
    c.source = "measured now; nominal for" + failed;
    return c;  // don't cache partial measurements
  }
  c.source = "measured now, cached in " + path;
  json j = {{"name", dev.name},
            {"uuid", dev.uuid},
            {"date", today()},
            {"read_tbps", c.read_tbps},
            {"bf16_tflops", c.bf16_tflops},
            {"fp8_tflops", c.fp8_tflops}};
  mkdirs(path);
  std::ofstream out(path);
  if (out) {
    out << j.dump(1) << "\n";
  } else {
    c.source = "measured now (cache " + path + " not writable)";
  }
  return c;
}

}  // namespace moekit::bench
