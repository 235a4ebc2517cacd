// The test binaries' watchdog (support/watchdog.h): its limit parsing, and that it ends a
// test that runs past its limit, naming it, with its exit code (this binary re-run on one
// disabled test that sleeps, with a half-second limit).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "support/watchdog.h"

namespace moekit::testing {
namespace {

TEST(Watchdog, ParsesSecondsAndTakesTheFlagOutOfArgv) {
  double s = -1;
  EXPECT_TRUE(parse_watchdog_seconds("120", &s));
  EXPECT_EQ(s, 120);
  EXPECT_TRUE(parse_watchdog_seconds("0.5", &s));
  EXPECT_EQ(s, 0.5);
  EXPECT_TRUE(parse_watchdog_seconds("0", &s));
  EXPECT_EQ(s, 0);
  s = 7;
  for (const char* bad : {"", "-1", "abc", "12s", "nan", "1e99"}) {
    EXPECT_FALSE(parse_watchdog_seconds(bad, &s)) << bad;
    EXPECT_EQ(s, 7) << bad;
  }
  char a0[] = "test", a1[] = "--moekit_watchdog_s=42", a2[] = "--gtest_brief=1";
  char* argv[] = {a0, a1, a2, nullptr};
  int argc = 3;
  EXPECT_EQ(watchdog_seconds_from(&argc, argv), 42);
  ASSERT_EQ(argc, 2);
  EXPECT_STREQ(argv[1], "--gtest_brief=1");
  EXPECT_EQ(argv[2], nullptr);
}

// Run only by the test below (in a child process).
TEST(WatchdogTarget, DISABLED_SleepsPastItsLimit) {
  std::this_thread::sleep_for(std::chrono::seconds(60));
}

TEST(Watchdog, EndsATestThatRunsPastItsLimit) {
  char exe[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) GTEST_SKIP() << "no /proc/self/exe: cannot re-run this binary";
  // Not sharded, no XML of its own: the child must run exactly the one test.
  const std::string cmd = "env -u GTEST_TOTAL_SHARDS -u GTEST_SHARD_INDEX -u GTEST_OUTPUT '" +
                          std::string(exe) +
                          "' --gtest_filter=WatchdogTarget.DISABLED_SleepsPastItsLimit"
                          " --gtest_also_run_disabled_tests --moekit_watchdog_s=0.5 2>/dev/null";
  const auto start = std::chrono::steady_clock::now();
  FILE* child = popen(cmd.c_str(), "r");
  ASSERT_NE(child, nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), child)) out += buf;
  const int status = pclose(child);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), kWatchdogExitCode) << out;
  EXPECT_NE(out.find("[ WATCHDOG ] WatchdogTarget.DISABLED_SleepsPastItsLimit exceeded 0.5"),
            std::string::npos)
      << out;
  EXPECT_LT(took, 30) << "the watchdog did not end the sleeping test";
}

}  // namespace
}  // namespace moekit::testing
