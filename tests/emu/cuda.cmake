# The project's CUDA tests (tests/cuda/*.cu), unmodified, on the emulator. Label emu; the kernel
# and stream tests also carry emu_tsan (run under ThreadSanitizer by `scripts/test.sh --tsan`).
moe_emu_cuda_test(NAME test_cuda_kernels_emu SOURCE test_cuda_kernels.cu LABELS emu_tsan UBSAN)
moe_emu_cuda_test(NAME test_cuda_shuffle_emu SOURCE test_cuda_shuffle.cu LABELS emu_tsan)
# The tests of the device layer (paths, policies, workspace, re-planning) instantiate the same
# layer templates: one program, device_layer_tests_emu, compiles them as one translation unit (GROUP,
# cmake/MoeHelpers.cmake): alone 78 s at -O2 for the five files, against 140 CPU-s as five programs
# in a 2-job build (2026-12-05).
set(MOE_TEST_GROUP_BATCH 5)
moe_emu_cuda_test(NAME test_cuda_layer_emu SOURCE test_cuda_layer.cu GROUP device_layer_tests_emu)
# Compile coverage with a workspace query that runs in a tenth of a second: the plain build's alone
# (under ASan + UBSan it cost minutes of compiling and checked nothing more).
if(NOT MOE_SANITIZE)
  moe_emu_cuda_test(NAME test_cuda_instantiate_emu SOURCE test_cuda_instantiate.cu GROUP device_layer_tests_emu)
endif()
moe_emu_cuda_test(NAME test_workspace_exact_cuda_emu SOURCE test_workspace_exact_cuda.cu GROUP device_layer_tests_emu)
moe_emu_cuda_test(NAME test_device_policies_emu SOURCE test_device_policies.cu GROUP device_layer_tests_emu)
moe_emu_cuda_test(NAME test_batch_split_cuda_emu SOURCE test_batch_split_cuda.cu LABELS emu_tsan)
moe_emu_cuda_test(NAME test_nccl_ranks_emu SOURCE test_nccl_ranks.cu LABELS emu_tsan)
# Under ThreadSanitizer, the live layer's cases with the most threads at once per pass: the
# re-planner's thread, NCCL ranks whose allocations fail in turn, capture refused on staged ranks,
# and the device disaggregated loop on 4 NCCL ranks (the migration's copies and all-to-all-v on the
# pass's stream, between the FinDEP pipeline's two communicators); a few BatchSplit passes, whose
# sort by expert runs on a stream of its own ([sort-stream]); and a few passes of a layer with a
# shared expert, which runs on a stream of its own ([shared-stream]).
# test_live_cuda.cu compiles only those cases under ThreadSanitizer.
if(MOE_SANITIZE STREQUAL "thread")
  moe_emu_cuda_test(NAME test_live_cuda_emu SOURCE test_live_cuda.cu LABELS emu_tsan GROUP device_layer_tests_emu)
else()
  moe_emu_cuda_test(NAME test_live_cuda_emu SOURCE test_live_cuda.cu GROUP device_layer_tests_emu)
endif()
# Smoke runs of the GPU benchmarks (tiny sizes, one iteration each) so that a benchmark's set-up bug
# shows here before a GPU run: bench_cuda_moe --smoke at reduced widths, decode size only;
# bench_cuda_shuffle at its smallest sizes; bench_cuda_batch_split at one decode and the prefill size.
find_package(benchmark CONFIG QUIET)
if(benchmark_FOUND AND NOT MOE_SANITIZE)
  foreach(_bench bench_cuda_moe bench_cuda_shuffle bench_cuda_batch_split)
    set(_wrap ${CMAKE_CURRENT_BINARY_DIR}/gen/${_bench}_emu.cpp)
    moe_include_unit(${_wrap} "benchmarks/cuda/${_bench}.cu built for the CUDA emulator" ${_bench}.cu)
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
  # bench_cuda_batch_split: the decode size and the deal (each checks the device split first), and
  # the series at 64 tokens per rank (40 batches, each checked against the host split), the split
  # over engine slots at 256 (checked against the host's), and the smallest code-fetch kernel on
  # one warp and on eight.
  add_test(NAME bench_cuda_batch_split_emu_smoke
           COMMAND bench_cuda_batch_split_emu "--benchmark_filter=(DeviceSplit/16|DeviceSplit/4096|Stages/16|Series/64|Deal|SlotSplit/256|CodeFetch/4/)"
                   --benchmark_min_time=0.000001)
  set_tests_properties(bench_cuda_moe_emu_smoke bench_cuda_shuffle_emu_smoke bench_cuda_batch_split_emu_smoke PROPERTIES
                       LABELS emu TIMEOUT 900 FAIL_REGULAR_EXPRESSION "ERROR OCCURRED|moe-emu:")
endif()

# The FinDEP executor test is the longest on the emulator: it runs as several CTest tests, one per
# group of cases, so that `ctest -j` spreads it over the cores (under ASan the point-to-point cases
# alone took 331 s as one test). The full-size bf16 comparisons (one per
# grouped-GEMM path) and the executor-only point-to-point worlds take minutes: they run in the plain
# build, the ASan build runs the other cases.
# Under ThreadSanitizer the whole executor test takes over 5 minutes; the stream-ordering cases run:
# short batches on the streams, graph capture and replay, the point-to-point executor through
# collective::Nccl on 2 and 4 ranks, the device disaggregated Layer's load window, and one world of
# the per-micro-batch split (its sort on a stream of its own).
# A sanitizer build compiles only the cases it runs: test_findep_cuda.cu and test_live_cuda.cu leave
# the others out under MOE_TEST_ASAN / MOE_TEST_TSAN (tests/support/sanitized.hpp), which took a
# quarter to a half off those programs' compile times there (2026-12-03).
if(MOE_SANITIZE STREQUAL "thread")
  moe_emu_cuda_test(NAME test_findep_cuda_emu SOURCE test_findep_cuda.cu LABELS emu_tsan)
else()
  moe_emu_cuda_test(NAME test_findep_cuda_emu SOURCE test_findep_cuda.cu ARGS "~[p2p]~*bf16*")
  # Every case is in exactly one part: the rest are the cases without [p2p] and without bf16 in their
  # name; a new bf16 case must end in "(bf16)" or "portable GEMM)" or get a part of its own.
  set(_parts "p2p_layer|[p2p][layer]~[nccl]" "p2p|[p2p][replicas],[p2p][bad-input]" "nccl|[nccl]")
  if(NOT MOE_SANITIZE)
    # The executor alone on 2-4 staged ranks: under ASan it ran 335 s, the longest test of that pass,
    # and p2p_layer runs the same executors on 3 and 4 ranks through the layer.
    list(APPEND _parts "p2p_ranks|[p2p]~[nccl]~[layer]~[replicas]~[bad-input]")
    list(APPEND _parts "bf16|*(bf16)" "bf16_portable|*portable GEMM)")
  endif()
  foreach(_part ${_parts})
    string(REPLACE "|" ";" _part "${_part}")
    list(GET _part 0 _suffix)
    list(GET _part 1 _filter)
    add_test(NAME test_findep_cuda_emu_${_suffix} COMMAND test_findep_cuda_emu "${_filter}")
    set_tests_properties(test_findep_cuda_emu_${_suffix} PROPERTIES LABELS emu TIMEOUT 900)
  endforeach()
endif()

# Longest first: CTest starts tests by COST (seconds, measured on the 2-core CI machine) before it has
# timings of its own, so that no long test starts last and runs alone.
foreach(_cost "test_findep_cuda_emu_bf16|140" "test_findep_cuda_emu_bf16_portable|140" "test_findep_cuda_emu|60"
              "test_findep_cuda_emu_p2p_ranks|100" "test_findep_cuda_emu_p2p_layer|50" "test_findep_cuda_emu_p2p|20"
              "test_findep_cuda_emu_nccl|40" "test_cuda_layer_emu|90" "bench_cuda_moe_emu_smoke|40"
              "test_cuda_kernels_emu|30" "test_workspace_exact_cuda_emu|30" "test_live_cuda_emu|80")
  string(REPLACE "|" ";" _cost "${_cost}")
  list(GET _cost 0 _test)
  list(GET _cost 1 _seconds)
  if(TEST ${_test})
    set_tests_properties(${_test} PROPERTIES COST ${_seconds})
  endif()
endforeach()

# The device examples (examples/paths/*.cu), unmodified, run on the emulator as written: their main()
# is renamed and called from a test case, which passes when it returns 0 (the layer matched the host
# reference). So the examples of the README's device paths are run, not only compiled, in CI.
if(NOT MOE_SANITIZE STREQUAL "thread")
  foreach(_example device device_disaggregated)
    set(_wrap ${CMAKE_CURRENT_BINARY_DIR}/gen/example_${_example}_emu.cpp)
    file(CONFIGURE OUTPUT ${_wrap} CONTENT "// Generated: examples/paths/${_example}.cu built for the CUDA emulator.
#define main moe_example_main
#include \"${_example}.cu\"
#undef main
#include <catch2/catch.hpp>
TEST_CASE(\"examples/paths/${_example}.cu runs as written and matches the reference\") {
  REQUIRE(moe_example_main() == 0);
}
")
    moe_emu_add_test(NAME example_${_example}_emu SOURCES ${_wrap} ADDRESS_ONLY)
    target_include_directories(example_${_example}_emu PRIVATE ${PROJECT_SOURCE_DIR}/examples/paths)
    target_compile_options(example_${_example}_emu PRIVATE -Wno-unknown-pragmas)
  endforeach()
endif()
# The device split's C interface (python/src/device_split.cu) for the emulator: a shared library the
# Python tests load with ctypes (tests/python/test_device_split.py, through moe_compose.device),
# with the calls for device memory that those tests use. scripts/test.sh points them at it
# (MOE_COMPOSE_DEVICE_LIB). Plain builds only: a sanitized one would need its runtime in Python.
if(NOT MOE_SANITIZE)
  set_target_properties(moe_emu PROPERTIES POSITION_INDEPENDENT_CODE ON)
  set(_unit ${CMAKE_CURRENT_BINARY_DIR}/gen/moe_compose_cuda_emu.cpp)
  moe_include_unit(${_unit} "python/src/device_split.cu built for the CUDA emulator" device_split.cu)
  add_library(moe_compose_cuda_emu SHARED ${_unit})
  target_include_directories(moe_compose_cuda_emu BEFORE PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/include)
  target_include_directories(moe_compose_cuda_emu PRIVATE ${PROJECT_SOURCE_DIR}/python/src)
  target_link_libraries(moe_compose_cuda_emu PRIVATE moe::moe moe_emu)
  target_compile_definitions(moe_compose_cuda_emu PRIVATE MOE_COMPOSE_TEST_MEMORY=1)
  target_compile_options(moe_compose_cuda_emu PRIVATE -Wall -Wextra -Wno-unknown-pragmas)
  if(MOE_EMU_TEST_OPT)
    separate_arguments(_opt UNIX_COMMAND "${MOE_EMU_TEST_OPT}")
    target_compile_options(moe_compose_cuda_emu PRIVATE ${_opt})
  endif()
endif()
