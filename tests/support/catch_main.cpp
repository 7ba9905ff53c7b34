// The one Catch2 main shared by every test program (Catch2 itself is in catch_impl.cpp).
#include <catch2/catch.hpp>

int main(int argc, char* argv[]) { return Catch::Session().run(argc, argv); }
