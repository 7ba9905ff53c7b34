# The project's CUDA tests (tests/cuda/*.cu), unmodified, on the emulator. Label emu; the kernel
# and stream tests also carry emu_tsan (run under ThreadSanitizer by `scripts/test.sh --tsan`).
moe_emu_cuda_test(NAME test_cuda_kernels_emu SOURCE test_cuda_kernels.cu LABELS emu_tsan)
moe_emu_cuda_test(NAME test_cuda_shuffle_emu SOURCE test_cuda_shuffle.cu LABELS emu_tsan)
moe_emu_cuda_test(NAME test_cuda_layer_emu SOURCE test_cuda_layer.cu)
moe_emu_cuda_test(NAME test_cuda_instantiate_emu SOURCE test_cuda_instantiate.cu)
moe_emu_cuda_test(NAME test_workspace_exact_cuda_emu SOURCE test_workspace_exact_cuda.cu)
moe_emu_cuda_test(NAME test_nccl_ranks_emu SOURCE test_nccl_ranks.cu LABELS emu_tsan)
# Smoke runs of the GPU benchmarks (tiny sizes, one iteration each) so that a benchmark's set-up bug
# shows here before a GPU session: bench_cuda_moe --smoke at reduced widths, decode size only;
# bench_cuda_shuffle at its smallest sizes.
find_package(benchmark CONFIG QUIET)
if(benchmark_FOUND AND NOT MOE_SANITIZE)
  foreach(_bench bench_cuda_moe bench_cuda_shuffle)
    set(_wrap ${CMAKE_CURRENT_BINARY_DIR}/gen/${_bench}_emu.cpp)
    file(CONFIGURE OUTPUT ${_wrap}
         CONTENT "// Generated: benchmarks/cuda/${_bench}.cu built for the CUDA emulator.\n#include \"${PROJECT_SOURCE_DIR}/benchmarks/cuda/${_bench}.cu\"\n")
    add_executable(${_bench}_emu ${_wrap})
    target_include_directories(${_bench}_emu BEFORE PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/include)
    target_include_directories(${_bench}_emu PRIVATE ${PROJECT_SOURCE_DIR}/benchmarks/cuda)
    target_link_libraries(${_bench}_emu PRIVATE moe_emu benchmark::benchmark moe::moe)
    target_compile_definitions(${_bench}_emu PRIVATE MOE_SHARED_DATA_DIR="${MOE_SHARED_DATA_DIR}")
  endforeach()
  add_test(NAME bench_cuda_moe_emu_smoke
           COMMAND bench_cuda_moe_emu --smoke "--benchmark_filter=(/128/|Copy)" --benchmark_min_time=0.000001)
  add_test(NAME bench_cuda_shuffle_emu_smoke
           COMMAND bench_cuda_shuffle_emu "--benchmark_filter=(olmoe/D8/128|Rows/bf16/tokens:128/hidden:2048/devices:8/)"
                   --benchmark_min_time=0.000001)
  set_tests_properties(bench_cuda_moe_emu_smoke bench_cuda_shuffle_emu_smoke PROPERTIES
                       LABELS emu TIMEOUT 900 FAIL_REGULAR_EXPRESSION "ERROR OCCURRED|moe-emu:")
endif()

# The FinDEP executor's full-size bf16 comparison takes minutes on the emulator: it runs in the plain
# build, the ASan build runs the other cases. Under ThreadSanitizer the executor test takes over
# 5 minutes even filtered, so it is not in the TSan pass yet (docs/cuda.md).
set(_findep_args "")
if(MOE_SANITIZE STREQUAL "thread")
  set(_findep_args "*fewer tokens*,*captured in a CUDA graph*,*through collective::Nccl*")
elseif(MOE_SANITIZE)
  set(_findep_args "~*(bf16)")
endif()
moe_emu_cuda_test(NAME test_findep_cuda_emu SOURCE test_findep_cuda.cu ARGS ${_findep_args})
if(MOE_SANITIZE STREQUAL "thread")
  # Under ThreadSanitizer the whole executor test takes over 5 minutes; the stream-ordering cases
  # run (about 30 s): short batches on the streams, graph capture and replay, and the point-to-point
  # executor through collective::Nccl on 2 and 4 ranks.
  set_tests_properties(test_findep_cuda_emu PROPERTIES LABELS "emu;emu_tsan")
endif()
