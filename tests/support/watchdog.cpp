#include "support/watchdog.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

namespace moekit::testing {
namespace {

using Clock = std::chrono::steady_clock;

// Shared by the listener (gtest's thread) and the watchdog thread. Allocated once and
// never freed: the thread is detached and may outlive main (it watches the exit too).
struct WatchState {
  std::mutex mu;
  std::condition_variable cv;
  double seconds = 0;
  bool armed = false;
  Clock::time_point deadline;
  std::string what;  // the running test's full name, or what runs after the last test
};

WatchState* g_state = nullptr;

[[noreturn]] void expire(const std::string& what, double seconds) {
  char line[1024];
  std::snprintf(line, sizeof(line),
                "[ WATCHDOG ] %s exceeded %g s: timed out (a hung kernel?), exiting\n",
                what.c_str(), seconds);
  std::fputs(line, stdout);
  std::fflush(stdout);
  std::fputs(line, stderr);
  std::fflush(stderr);
  std::_Exit(kWatchdogExitCode);
}

void watch(WatchState* s) {
  std::unique_lock<std::mutex> lock(s->mu);
  for (;;) {
    if (!s->armed) {
      s->cv.wait(lock);
      continue;
    }
    const Clock::time_point deadline = s->deadline;
    if (s->cv.wait_until(lock, deadline) == std::cv_status::timeout && s->armed &&
        s->deadline == deadline && Clock::now() >= deadline) {
      expire(s->what, s->seconds);
    }
  }
}

void arm(const std::string& what) {
  std::lock_guard<std::mutex> lock(g_state->mu);
  g_state->what = what;
  g_state->deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(g_state->seconds));
  g_state->armed = true;
  g_state->cv.notify_one();
}

void disarm() {
  std::lock_guard<std::mutex> lock(g_state->mu);
  g_state->armed = false;
  g_state->cv.notify_one();
}

class WatchdogListener : public ::testing::EmptyTestEventListener {
  void OnTestStart(const ::testing::TestInfo& info) override {
    arm(std::string(info.test_suite_name()) + "." + info.name());
  }
  void OnTestEnd(const ::testing::TestInfo&) override { disarm(); }
  // From here to the process's exit: CUDA teardown waits on work still running.
  void OnTestProgramEnd(const ::testing::UnitTest&) override { arm("the exit after the tests"); }
};

}  // namespace

bool parse_watchdog_seconds(const std::string& text, double* seconds) {
  if (text.empty()) return false;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (*end != 0 || !(v >= 0) || v > 1e7) return false;
  *seconds = v;
  return true;
}

double watchdog_seconds_from(int* argc, char** argv) {
  double seconds = kWatchdogDefaultSeconds;
  if (const char* env = std::getenv("MOEKIT_TEST_WATCHDOG_S")) {
    if (!parse_watchdog_seconds(env, &seconds)) {
      std::fprintf(stderr, "MOEKIT_TEST_WATCHDOG_S=%s: expected seconds >= 0; using %g\n", env,
                   seconds);
    }
  }
  const char* flag = "--moekit_watchdog_s=";
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    if (std::strncmp(argv[i], flag, std::strlen(flag)) == 0) {
      if (!parse_watchdog_seconds(argv[i] + std::strlen(flag), &seconds)) {
        std::fprintf(stderr, "%s: expected seconds >= 0; using %g\n", argv[i], seconds);
      }
      continue;
    }
    argv[out++] = argv[i];
  }
  *argc = out;
  argv[out] = nullptr;
  return seconds;
}

void install_watchdog(double seconds) {
  if (seconds <= 0 || g_state != nullptr) return;
  g_state = new WatchState;
  g_state->seconds = seconds;
  std::thread(watch, g_state).detach();
  ::testing::UnitTest::GetInstance()->listeners().Append(new WatchdogListener);
}

double watchdog_seconds() {
  return g_state ? g_state->seconds : 0;
}

}  // namespace moekit::testing
