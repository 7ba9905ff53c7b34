// The program a GPU test becomes in a device-only build (MOE_CUDA_TESTS=device-only, the default when
// the build machine has no GPU; tests/cuda/CMakeLists.txt): the test's device code was compiled, its
// program was not. It says so and exits 77, which CTest reports as skipped.
#include <cstdio>

int main(int, char** argv) {
  std::printf("%s: device code only (MOE_CUDA_TESTS=device-only, no GPU at configure time); "
              "configure with -DMOE_CUDA_TESTS=full on a machine with a GPU to build and run this test\n",
              argv[0]);
  return 77;
}
