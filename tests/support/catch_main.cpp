// The one Catch2 main shared by every test program (Catch2 itself is in catch_impl.cpp).
#include "catch_run.hpp"

int main(int argc, char** argv) { return moe::test::run_catch(argc, argv); }
