// The entry into Catch2's session (tests/support/catch_impl.cpp): Catch2 declares its Session only
// in the translation unit that holds its implementation, so the mains call this instead.
#pragma once

namespace moe::test {

/// Runs the test cases the command line selects; returns the process exit status. With `report`
/// false the report goes to the debug stream instead of standard output.
int run_catch(int argc, char** argv, bool report = true);

}  // namespace moe::test
