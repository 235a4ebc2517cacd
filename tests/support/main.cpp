// main() of every test binary (tests/CMakeLists.txt links it in place of gtest_main):
// gtest with the per-test watchdog (support/watchdog.h).
#include <gtest/gtest.h>

#include "support/watchdog.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  moekit::testing::install_watchdog(moekit::testing::watchdog_seconds_from(&argc, argv));
  return RUN_ALL_TESTS();
}
