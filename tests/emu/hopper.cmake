# test_emu_hopper: the emulator's sm_90a PTX models (tests/emu/include/emu/hopper.hpp) against CuTe's
# layouts. The oracle is the CuTe headers of the PyPI package nvidia-cutlass (scripts/deps.sh
# installs it), compiled host-only with g++ in a translation unit of its own (tests/oracle/
# cute_oracle.cpp); CuTe includes libcu++ (<cuda/std/...>) and CUTLASS's numeric types the toolkit's
# <cuda_fp16.h>, taken from the CUDA toolkit (or the PyPI packages nvidia-cuda-cccl and
# nvidia-cuda-runtime). A test-time oracle only: the library never includes CuTe. Without it test_emu_hopper is left out
# (moe_missing_oracle), or the configuration stops under -DMOE_REQUIRE_TEST_DEPS=ON (scripts/test.sh).
# Included by tests/emu/CMakeLists.txt.

find_program(MOE_PYTHON3 NAMES python3 python)
set(_cutlass_hint "")
set(_cccl_hints "")
if(MOE_PYTHON3)
  execute_process(COMMAND ${MOE_PYTHON3} -c "import cutlass_library, os; print(os.path.dirname(cutlass_library.__file__))"
                  OUTPUT_VARIABLE _cutlass_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _cutlass_rc)
  if(_cutlass_rc EQUAL 0 AND _cutlass_dir)
    set(_cutlass_hint ${_cutlass_dir}/source/include)
  endif()
  # libcu++ from PyPI (nvidia-cuda-cccl), where no toolkit provides it.
  execute_process(COMMAND ${MOE_PYTHON3} -c
                          "import nvidia, os; print(';'.join(os.path.join(p, d, 'include', s) for p in nvidia.__path__ for d in os.listdir(p) for s in ('', 'cccl')))"
                  OUTPUT_VARIABLE _cccl_py OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  list(APPEND _cccl_hints ${_cccl_py})
endif()
find_path(MOE_CUTE_INCLUDE_DIR cute/tensor.hpp HINTS ${_cutlass_hint} NO_DEFAULT_PATH)
find_path(MOE_CCCL_INCLUDE_DIR cuda/std/utility
          HINTS ${CUDAToolkit_INCLUDE_DIRS}/cccl /usr/local/cuda/include/cccl /usr/local/cuda/include ${_cccl_hints}
          NO_DEFAULT_PATH)
# CUTLASS's numeric types include the toolkit's <cuda_fp16.h> and <cuComplex.h> (host-only use).
find_path(MOE_CUDA_HEADERS_DIR cuda_fp16.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include ${_cccl_hints})

if(NOT MOE_CUTE_INCLUDE_DIR)
  moe_missing_oracle("test_emu_hopper (the emulator's sm_90 models against CuTe)" "the CuTe headers (cutlass_library/source/include/cute)" "pip install nvidia-cutlass")
  return()
endif()
if(NOT MOE_CCCL_INCLUDE_DIR OR NOT MOE_CUDA_HEADERS_DIR)
  moe_missing_oracle("test_emu_hopper (the emulator's sm_90 models against CuTe)" "libcu++ (<cuda/std/utility>) or <cuda_fp16.h>, which CuTe includes" "the CUDA toolkit, or pip install nvidia-cuda-cccl nvidia-cuda-runtime")
  return()
endif()
set(_oracle_includes ${MOE_CUTE_INCLUDE_DIR} ${MOE_CCCL_INCLUDE_DIR} ${MOE_CUDA_HEADERS_DIR})

# The oracle must compile host-only with this compiler: try it at configure time, so that a broken
# or missing oracle stops the configuration instead of failing (or vanishing) later.
set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)
try_compile(_cute_ok ${CMAKE_CURRENT_BINARY_DIR}/cute_probe SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/tests/oracle/cute_oracle.cpp
            CMAKE_FLAGS "-DINCLUDE_DIRECTORIES=${_oracle_includes}"
            COMPILE_DEFINITIONS -DCUTE_CVTA_GENERIC_TO_SHARED_ACTIVATED=1
            CXX_STANDARD 20 OUTPUT_VARIABLE _cute_log)
unset(CMAKE_TRY_COMPILE_TARGET_TYPE)
if(NOT _cute_ok)
  string(SUBSTRING "${_cute_log}" 0 3000 _cute_log_head)
  if(MOE_REQUIRE_TEST_DEPS)
    message(FATAL_ERROR "moe: the CuTe headers in ${MOE_CUTE_INCLUDE_DIR} do not compile host-only with ${CMAKE_CXX_COMPILER} (tests/emu/tests/oracle/cute_oracle.cpp):\n${_cute_log_head}")
  endif()
  moe_missing_oracle("test_emu_hopper (the emulator's sm_90 models against CuTe)" "CuTe headers that compile host-only with ${CMAKE_CXX_COMPILER}" "see tests/emu/hopper.cmake")
  return()
endif()
message(STATUS "moe: CuTe oracle for the sm_90 models: ${MOE_CUTE_INCLUDE_DIR}")

# CuTe lives in its own translation unit, away from the emulator's stand-ins for the toolkit's headers.
add_library(moe_cute_oracle STATIC tests/oracle/cute_oracle.cpp)
target_include_directories(moe_cute_oracle SYSTEM PRIVATE ${_oracle_includes})
target_compile_definitions(moe_cute_oracle PRIVATE CUTE_CVTA_GENERIC_TO_SHARED_ACTIVATED=1)
target_compile_features(moe_cute_oracle PRIVATE cxx_std_20)
moe_sanitize(moe_cute_oracle)

moe_emu_add_test(NAME test_emu_hopper SOURCES tests/test_emu_hopper.cpp LABELS emu_tsan ARGS ${_emu_tsan_args}
                 LINK moe_cute_oracle)
target_include_directories(test_emu_hopper PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/tests)
target_compile_options(test_emu_hopper PRIVATE -Wno-unknown-pragmas)  # nvcc's #pragma unroll
