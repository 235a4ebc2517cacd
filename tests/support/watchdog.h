// Per-test time limit of the gtest binaries (installed by tests/support/main.cpp): a test
// that runs past the limit (a hung kernel: an mbarrier or spin-wait deadlock, a PDL
// chain that never completes) ends the whole process with a line naming it, instead of
// hanging the run until an outer timeout kills it without saying which test hung.
//
// Limit: kWatchdogDefaultSeconds, else MOEKIT_TEST_WATCHDOG_S in the environment, else
// the flag --moekit_watchdog_s=N (the flag wins; 0 turns the watchdog off). After the
// last test the same limit covers the process's exit (CUDA teardown behind a hung
// kernel). On expiry it prints
//   [ WATCHDOG ] Suite.Name exceeded N s: timed out (a hung kernel?), exiting
// to stdout and stderr and ends the process with std::_Exit(kWatchdogExitCode): no
// destructor or atexit handler runs (they could wait on the hung GPU work).
#pragma once

#include <string>

namespace moekit::testing {

constexpr double kWatchdogDefaultSeconds = 300;
constexpr int kWatchdogExitCode = 86;

// The limit from the environment and the command line (removes the flag from argv).
double watchdog_seconds_from(int* argc, char** argv);

// Installs the listener and starts the watchdog thread (no-op for seconds <= 0). Call
// after ::testing::InitGoogleTest, before RUN_ALL_TESTS.
void install_watchdog(double seconds);

// The limit in force (0 = none installed).
double watchdog_seconds();

// Parses a limit in seconds ("120", "2.5", "0"); false for anything else.
bool parse_watchdog_seconds(const std::string& text, double* seconds);

}  // namespace moekit::testing
