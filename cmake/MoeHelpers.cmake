# Helpers for the project's own tests, examples and benchmarks (not installed).

# Test-only dependencies (Catch2, the independent oracles GLPK, LEMON, METIS, nlohmann-json, the
# CuTe headers, PyYAML) are never needed to configure or build the library, the demo or the planner
# programs. A missing one leaves out the checks that use it; the top-level CMakeLists.txt then says,
# in one line, which checks were left out and how to get them. scripts/test.sh configures with
# -DMOE_REQUIRE_TEST_DEPS=ON, which turns every such gap into an error: a test run never skips an
# oracle silently.
option(MOE_REQUIRE_TEST_DEPS "stop the configuration when a test-only dependency is missing" OFF)
set_property(GLOBAL PROPERTY MOE_LEFT_OUT "")
# moe_missing_oracle(<checks left out> <what is missing> <how to get it>)
function(moe_missing_oracle checks missing how)
  if(MOE_REQUIRE_TEST_DEPS)
    message(FATAL_ERROR "moe: ${missing} not found, which ${checks} need. Install it (${how}; scripts/test.sh "
                        "installs every test dependency) or configure without -DMOE_REQUIRE_TEST_DEPS=ON to leave "
                        "those checks out.")
  endif()
  set_property(GLOBAL APPEND PROPERTY MOE_LEFT_OUT "${checks} [${missing}: ${how}]")
endfunction()

# What the tools share with the tests (the planner CLI's option parser, the comparison scenarios, the
# SimGrid replay, the GPU size sweep): headers under tools/include/moe_tools/, reached through this
# target's include directory by tools and tests alike.
if(NOT TARGET moe_tool_headers)
  add_library(moe_tool_headers INTERFACE)
  target_include_directories(moe_tool_headers INTERFACE ${PROJECT_SOURCE_DIR}/tools/include)
  target_link_libraries(moe_tool_headers INTERFACE moe)
endif()

# One Catch2 main, compiled once and linked into every test program.
set(MOE_HAS_CATCH2 OFF)
if(MOE_BUILD_TESTS)
  find_package(Catch2 2 QUIET)
  if(Catch2_FOUND)
    set(MOE_HAS_CATCH2 ON)
  else()
    moe_missing_oracle("the test suite" "Catch2 v2" "apt-get install catch2")
  endif()
endif()
if(MOE_HAS_CATCH2 AND NOT TARGET moe_catch_main)
  # Catch2's implementation: once per build, at -O1 without debug info or sanitizers (it is not code
  # under test; under ASan + UBSan at -O2 -g it took over three minutes to compile, twice).
  add_library(moe_catch_impl STATIC ${PROJECT_SOURCE_DIR}/tests/support/catch_impl.cpp)
  target_link_libraries(moe_catch_impl PUBLIC Catch2::Catch2)
  target_include_directories(moe_catch_impl PUBLIC ${PROJECT_SOURCE_DIR}/tests/support)
  target_compile_options(moe_catch_impl PRIVATE -O1 -g0)
  add_library(moe_catch_main STATIC ${PROJECT_SOURCE_DIR}/tests/support/catch_main.cpp)
  target_link_libraries(moe_catch_main PUBLIC moe_catch_impl moe::moe)
  target_include_directories(moe_catch_main PUBLIC ${PROJECT_SOURCE_DIR}/tests/support)
  if(TARGET moe_mpi)
    add_library(moe_mpi_main STATIC ${PROJECT_SOURCE_DIR}/tests/support/mpi_main.cpp)
    target_link_libraries(moe_mpi_main PUBLIC moe_catch_impl moe::mpi)
    target_include_directories(moe_mpi_main PUBLIC ${PROJECT_SOURCE_DIR}/tests/support)
  endif()
endif()

# Real routing statistics (OLMoE, Mixtral) used by tests and benchmarks. A copy lives in tests/data
# (Apache-2.0, see its LICENSE) so a clean clone tests the same on every machine.
set(MOE_SHARED_DATA_DIR "${PROJECT_SOURCE_DIR}/tests/data" CACHE PATH
    "Folder holding olmoe-routing/ (real routing statistics used by tests and benchmarks)")
if(NOT EXISTS "${MOE_SHARED_DATA_DIR}/olmoe-routing/README.md")
  message(FATAL_ERROR "moe: MOE_SHARED_DATA_DIR=${MOE_SHARED_DATA_DIR} holds no olmoe-routing/ folder")
endif()

# MOE_SANITIZE: OFF, ON (AddressSanitizer + UndefinedBehaviorSanitizer) or thread (ThreadSanitizer).
# moe_sanitize(<target> [ADDRESS_ONLY]): ADDRESS_ONLY compiles the target's own code with ASan alone
# under ON (it still links UBSan's runtime, for the libraries it links that have UBSan's checks).
# UBSan's `vptr` check (the dynamic type at each member access of a polymorphic class) is left out:
# the library's policies are templates, and the check cost 15 % of a host test's compile time
# (tests/schedule/test_disaggregated.cpp under ASan + UBSan at -O0: 53 s with it, 45 s without).
function(moe_sanitize target)
  cmake_parse_arguments(S "ADDRESS_ONLY" "" "" ${ARGN})
  if(MOE_SANITIZE STREQUAL "thread")
    target_compile_options(${target} PRIVATE -fsanitize=thread -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=thread)
  elseif(MOE_SANITIZE AND S_ADDRESS_ONLY)
    target_compile_options(${target} PRIVATE -fsanitize=address -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  elseif(MOE_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=address,undefined -fno-sanitize=vptr -fno-omit-frame-pointer
                                             -fno-sanitize-recover=undefined)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
endfunction()

# Optimisation of the host and MPI test programs (not the emulated CUDA tests, not the library's
# examples, tools or benchmarks), appended after the build type's flags: empty keeps the build type's.
# scripts/test.sh builds them at -O1 (and at -O0 under the sanitizers): a test program checks results,
# and g++ spends most of a test's compile time optimising it (test_planned_layer.cpp on the 2-core CI
# machine: 52 s at -O3, 31 s at -O1, 22 s at -O0; under ASan + UBSan 151 s at -O1, 52 s at -O0).
set(MOE_HOST_TEST_OPT "" CACHE STRING "compiler flags for the host and MPI test programs, e.g. -O1 (empty: the build type's)")
# The same for the emulated CUDA test programs (label emu). Their run time is the emulated kernels',
# which -O1 slows (the FinDEP bf16 cases: 163 s against 105 s at -O3) and -O2 hardly does, while -O2
# compiles them in a quarter to a third less time than -O3. On the 2-core CI machine (2026-11-29):
# test_cuda_layer_emu 80 -> 54 s and test_findep_cuda_emu 84 -> 64 s alone; the emulated tests'
# objects 532 -> 444 CPU-s in a 2-job build; `ctest -L emu -j2` 182 -> 188 s. scripts/test.sh
# builds them at -O2.
set(MOE_EMU_TEST_OPT "" CACHE STRING "compiler flags for the emulated CUDA test programs, e.g. -O2 (empty: the build type's)")

# moe_add_test(NAME <name> SOURCES <files...> LABELS <host|mpi|cuda> [LINK <targets...>]
#              [MAIN catch|mpi] [MPI_RANKS <n>] [ARGS <args...>] [ADDRESS_ONLY] [GROUP <program>])
# A host test runs its program once. An MPI test runs it under mpirun with MPI_RANKS processes.
# ADDRESS_ONLY: under MOE_SANITIZE=ON, the program's own code has ASan's checks but not UBSan's.
#
# GROUP <program>: the test's one source file is compiled into <program>, with the other tests of
# that group, and the test runs <program> on its own cases alone (Catch2's file tags: `<program>
# "[#<file name without extension>]" -#`). The group's files are compiled a few at a time in one
# translation unit (moe_finish_test_group), so that what they share (Catch2, the library's headers,
# the layer templates they all instantiate) is parsed and compiled once per unit instead of once per
# test: the host layer tests took 220 CPU-s as 19 programs in a cold 2-job build and 103 s as two
# programs of four units, the host tests of the five folders 453 -> 239 CPU-s (2026-12-05, the
# 2-core CI machine kind; docs/results/ci-time.md). Every test of a group has the same MAIN,
# ADDRESS_ONLY and kind of labels (emu or not); their LINK targets add up. A file's names at
# namespace scope (anonymous namespaces too) and its TEST_CASE names must differ from those of the
# group's other files, and a file-scope `using namespace` reaches the files after it in the unit:
# qualify a name that two such namespaces declare. `--warn NoTests` fails a test whose tag selects
# no case.
function(moe_add_test)
  cmake_parse_arguments(T "ADDRESS_ONLY" "NAME;MPI_RANKS;MAIN;GROUP" "SOURCES;LABELS;LINK;ARGS" ${ARGN})
  set(_target ${T_NAME})
  set(_run_args ${T_ARGS})
  if(T_GROUP)
    set(_target ${T_GROUP})
    list(LENGTH T_SOURCES _n)
    if(NOT _n EQUAL 1)
      message(FATAL_ERROR "moe_add_test(${T_NAME}): a test of GROUP ${T_GROUP} has one source file, got ${T_SOURCES}")
    endif()
    get_filename_component(_stem "${T_SOURCES}" NAME_WE)
    set(_run_args "[#${_stem}]" "-#" --warn NoTests ${T_ARGS})
  endif()
  if("emu" IN_LIST T_LABELS)
    set(_kind emu)
  else()
    set(_kind plain)
  endif()
  set(_shape "${T_MAIN}|${T_ADDRESS_ONLY}|${_kind}")
  if(NOT TARGET ${_target})
    if(T_GROUP)
      add_executable(${_target})
      set_target_properties(${_target} PROPERTIES MOE_GROUP_SHAPE "${_shape}" MOE_GROUP_SOURCES "")
      # Through EVAL, so that the deferred call gets the name now (DEFER evaluates its arguments when
      # the call runs).
      cmake_language(EVAL CODE "cmake_language(DEFER CALL moe_finish_test_group [[${_target}]])")
    else()
      add_executable(${_target} ${T_SOURCES})
    endif()
    set(_main moe_catch_main)
    if(T_MAIN STREQUAL "mpi")
      set(_main moe_mpi_main)
    endif()
    target_link_libraries(${_target} PRIVATE ${_main} moe::moe)
    target_compile_definitions(${_target} PRIVATE MOE_SHARED_DATA_DIR="${MOE_SHARED_DATA_DIR}")
    target_compile_options(${_target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>)
    if(_kind STREQUAL "emu")
      set(_opt "${MOE_EMU_TEST_OPT}")
    else()
      set(_opt "${MOE_HOST_TEST_OPT}")
    endif()
    if(_opt)
      separate_arguments(_opt UNIX_COMMAND "${_opt}")
      target_compile_options(${_target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${_opt}>")
    endif()
    if(T_ADDRESS_ONLY)
      moe_sanitize(${_target} ADDRESS_ONLY)
    else()
      moe_sanitize(${_target})
    endif()
    if(T_MAIN STREQUAL "mpi")
      moe_sanitize(moe_mpi_main)
    else()
      moe_sanitize(moe_catch_main)
    endif()
  elseif(T_GROUP)
    get_target_property(_group_shape ${_target} MOE_GROUP_SHAPE)
    if(NOT _group_shape STREQUAL _shape)
      message(FATAL_ERROR "moe_add_test(${T_NAME}): GROUP ${T_GROUP} holds tests of MAIN|ADDRESS_ONLY|kind "
                          "'${_group_shape}', this one is '${_shape}'")
    endif()
  endif()
  if(T_LINK)
    target_link_libraries(${_target} PRIVATE ${T_LINK})
  endif()
  if(T_GROUP)
    get_filename_component(_src "${T_SOURCES}" ABSOLUTE)
    get_target_property(_srcs ${_target} MOE_GROUP_SOURCES)
    if(NOT _src IN_LIST _srcs)
      set_property(TARGET ${_target} APPEND PROPERTY MOE_GROUP_SOURCES "${_src}")
    endif()
  endif()
  set(_test_name ${T_NAME})
  if(T_MPI_RANKS)
    set(_test_name ${T_NAME}_np${T_MPI_RANKS})
    add_test(NAME ${_test_name}
             COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe ${MPIEXEC_NUMPROC_FLAG} ${T_MPI_RANKS}
                     $<TARGET_FILE:${_target}> ${_run_args})
    set_tests_properties(${_test_name} PROPERTIES
      ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1"
      PROCESSORS ${T_MPI_RANKS})
  else()
    add_test(NAME ${_test_name} COMMAND ${_target} ${_run_args})
  endif()
  set_tests_properties(${_test_name} PROPERTIES LABELS "${T_LABELS}" TIMEOUT 900)
  if("cuda" IN_LIST T_LABELS)
    # A GPU test exits with 77 when no device is present; CTest reports it as skipped.
    set_tests_properties(${_test_name} PROPERTIES SKIP_RETURN_CODE 77)
  endif()
endfunction()

# moe_include_unit(<output> <what> <file names...>): writes <output>, a translation unit that includes
# each file by name (found through the including target's include path) under a comment saying
# <what>. Its text is the same in every checkout, so a compiler cache hits across clones in different
# folders, and file(CONFIGURE) rewrites it only when the text changes. The test groups' units, the
# GPU tests' device unit (tests/cuda) and the emulator's wrappers of .cu files (tests/emu) are these.
function(moe_include_unit output what)
  set(_text "// Generated (moe_include_unit, cmake/MoeHelpers.cmake): ${what}.\n")
  foreach(_name IN LISTS ARGN)
    string(APPEND _text "#include \"${_name}\"\n")
  endforeach()
  file(CONFIGURE OUTPUT ${output} CONTENT "${_text}")
endfunction()

# moe_finish_test_group(<program>), called at the end of the folder that made the group: the group's
# files, in the order their tests were added, as translation units of at most MOE_TEST_GROUP_BATCH
# files each (the folder's value; default 6), of sizes that differ by at most one (moe_include_unit).
function(moe_finish_test_group target)
  get_target_property(_srcs ${target} MOE_GROUP_SOURCES)
  set(_batch 6)
  if(MOE_TEST_GROUP_BATCH)
    set(_batch ${MOE_TEST_GROUP_BATCH})
  endif()
  list(LENGTH _srcs _n)
  math(EXPR _units "(${_n} + ${_batch} - 1) / ${_batch}")
  set(_dirs "")
  set(_unit 0)
  set(_taken 0)
  set(_in_unit "")
  set(_names "")
  foreach(_src IN LISTS _srcs)
    get_filename_component(_dir "${_src}" DIRECTORY)
    get_filename_component(_name "${_src}" NAME)
    get_filename_component(_stem "${_src}" NAME_WE)
    # A unit includes a file by its name, and a test selects its cases by the name's stem.
    if(_stem IN_LIST _names)
      message(FATAL_ERROR "moe_add_test: two files of test program ${target} are named ${_stem}.*: rename one")
    endif()
    list(APPEND _names "${_stem}")
    list(APPEND _dirs "${_dir}")
    list(APPEND _in_unit "${_name}")
    math(EXPR _taken "${_taken} + 1")
    # Unit u ends after file ceil((u + 1) * n / units): sizes differ by at most one.
    math(EXPR _end "((${_unit} + 1) * ${_n} + ${_units} - 1) / ${_units}")
    if(_taken EQUAL _end)
      set(_gen ${CMAKE_CURRENT_BINARY_DIR}/gen/${target}_${_unit}.cpp)
      moe_include_unit(${_gen} "unit ${_unit} of test program ${target} (moe_finish_test_group)" ${_in_unit})
      target_sources(${target} PRIVATE ${_gen})
      set(_in_unit "")
      math(EXPR _unit "${_unit} + 1")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES _dirs)
  target_include_directories(${target} PRIVATE ${_dirs})
endfunction()

# moe_spill_check(<target> [ALLOW_SPILLS]): ptxas warns when a kernel of the target's CUDA files
# spills registers to local memory (-warn-spills) or uses local memory at all (-warn-lmem-usage: an
# array indexed at run time lives there, per-thread memory behind L1, as the split kernel's header
# sums did). Where tests/cuda/CMakeLists.txt sets the global property MOE_SPILLS_FATAL (its
# device-only build for the default architecture alone, sm_90a: CI's, on a machine without a GPU)
# either fails the build; a GPU machine's build, or one for other architectures, only warns.
# ALLOW_SPILLS exempts a target whose kernel needs local memory by design. The GPU tests, examples,
# benchmarks and tools all take it: they instantiate the kernels with different types and shapes
# (docs/cuda.md, "Tests (label `cuda`)").
function(moe_spill_check target)
  cmake_parse_arguments(_arg "ALLOW_SPILLS" "" "" ${ARGN})
  get_property(_fatal GLOBAL PROPERTY MOE_SPILLS_FATAL)
  if(_fatal AND NOT _arg_ALLOW_SPILLS)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-warn-spills,-warn-lmem-usage,-Werror>)
  else()
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-warn-spills,-warn-lmem-usage>)
  endif()
endfunction()

# moe_add_benchmark(NAME <name> SOURCES <files...> [LINK <targets...>])
function(moe_add_benchmark)
  cmake_parse_arguments(B "" "NAME" "SOURCES;LINK" ${ARGN})
  add_executable(${B_NAME} ${B_SOURCES})
  target_link_libraries(${B_NAME} PRIVATE benchmark::benchmark moe::moe ${B_LINK})
  target_compile_definitions(${B_NAME} PRIVATE MOE_SHARED_DATA_DIR="${MOE_SHARED_DATA_DIR}")
endfunction()

# moe_add_areas(<area>...): add_subdirectory() for each area folder that exists and is selected by
# MOE_AREAS.
function(moe_add_areas)
  foreach(area ${ARGN})
    if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/${area}/CMakeLists.txt AND
       (MOE_AREAS STREQUAL "all" OR area IN_LIST MOE_AREAS))
      add_subdirectory(${area})
    endif()
  endforeach()
endfunction()
