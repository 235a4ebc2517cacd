// The plan log (core/plan_log.h): one line per distinct (op, shape key), thread-safe.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/plan_log.h"

namespace moekit {
namespace {

// The whole content written to `f` so far.
std::string contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) s.append(buf, n);
  return s;
}

TEST(PlanLog, PrintsEachOpAndShapeOnce) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    detail::PlanLog log(f);
    EXPECT_TRUE(log.log("moe_grouped_gemm", "bf16 E=8 m=512 n=4096 k=7168", "sm90 128x256"));
    EXPECT_FALSE(log.log("moe_grouped_gemm", "bf16 E=8 m=512 n=4096 k=7168", "other plan"));
    EXPECT_TRUE(log.log("moe_grouped_gemm", "bf16 E=8 m=1 n=4096 k=7168", "mma 64x128"));
    EXPECT_TRUE(log.log("fused_moe", "bf16 E=8 m=512 n=4096 k=7168", "sorted"));
    EXPECT_FALSE(log.log("fused_moe", "bf16 E=8 m=512 n=4096 k=7168", "sorted"));
  }
  EXPECT_EQ(contents(f),
            "moekit plan: moe_grouped_gemm bf16 E=8 m=512 n=4096 k=7168 -> sm90 128x256\n"
            "moekit plan: moe_grouped_gemm bf16 E=8 m=1 n=4096 k=7168 -> mma 64x128\n"
            "moekit plan: fused_moe bf16 E=8 m=512 n=4096 k=7168 -> sorted\n");
  std::fclose(f);
}

// Threads logging overlapping keys at once: every key printed exactly once, as whole lines.
TEST(PlanLog, ConcurrentCallersPrintEachKeyOnce) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  constexpr int kThreads = 8, kKeys = 64, kRepeats = 50;
  {
    detail::PlanLog log(f);
    std::vector<std::thread> threads;
    std::vector<int> printed(kThreads, 0);
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&, i] {
        for (int r = 0; r < kRepeats; ++r)
          for (int k = 0; k < kKeys; ++k)
            printed[i] += log.log("op", "key" + std::to_string((k + i * 7) % kKeys),
                                  "plan" + std::to_string((k + i * 7) % kKeys));
      });
    }
    for (std::thread& t : threads) t.join();
    int total = 0;
    for (int p : printed) total += p;
    EXPECT_EQ(total, kKeys);
  }
  std::istringstream lines(contents(f));
  std::set<std::string> seen;
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    ++n;
    seen.insert(line);
  }
  EXPECT_EQ(n, kKeys);
  for (int k = 0; k < kKeys; ++k) {
    const std::string key = std::to_string(k);
    EXPECT_EQ(seen.count("moekit plan: op key" + key + " -> plan" + key), 1u) << key;
  }
  std::fclose(f);
}

// The switch follows MOEKIT_LOG_PLANS (read once): on for any value but empty or "0".
TEST(PlanLog, EnabledByTheEnvironment) {
  const char* v = std::getenv("MOEKIT_LOG_PLANS");
  EXPECT_EQ(detail::plan_log_enabled(), v != nullptr && v[0] != '\0' && v[0] != '0');
  detail::log_plan("op", "key", "plan");  // prints at most one line to stderr
}

}  // namespace
}  // namespace moekit
