# The CUB, cuBLAS and WMMA shims (header-only: tests/emu/include/emu/{cub,cublas,wmma}.hpp behind
# <cub/...>, <cublas_v2.h> and <mma.h>) against brute-force references, and their contracts.
# Included by tests/emu/CMakeLists.txt. Cases tagged [errors] abandon a failing kernel or plant a
# race on purpose: left out under ThreadSanitizer like the core's.
moe_emu_add_test(NAME test_emu_shims SOURCES tests/test_emu_shims.cpp LABELS emu_tsan ARGS ${_emu_tsan_args})
