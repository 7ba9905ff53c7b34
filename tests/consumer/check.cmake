# Builds and runs the consumer project (tests/consumer) every way the README shows, and checks the
# installed package's promises. Arguments: -DSOURCE=<moe source> -DBUILD=<moe build> -DWORK=<scratch>
#
#  1. install: `cmake --install` into a clean prefix; the installed CMake files hold no absolute path.
#  2. core: find_package(moe CONFIG REQUIRED) with every optional package disabled
#     (CMAKE_DISABLE_FIND_PACKAGE_<X>=ON for CUDAToolkit, NCCL, MPI, nlohmann_json, yaml-cpp): it
#     must configure, build and run, and must not have looked for any of them.
#  3. each component (cuda, nccl, mpi, interop): configures, builds and runs where its packages are
#     found here; where they are not, find_package must stop with the one message naming them.
#  4. a required component whose package is disabled, and an unknown component: the clear message.
#  5. add_subdirectory and FetchContent (from a file:// archive of the source tree; nothing is
#     downloaded), both with every optional package disabled.
# Each consumer builds with no build type (no optimisation): what is checked is the packaging, and
# seven optimised builds of moe.hpp took most of this test's 159 s.
file(REMOVE_RECURSE ${WORK})
set(optional_packages CUDAToolkit NCCL MPI nlohmann_json yaml-cpp)
set(no_optional -DMOE_ENABLE_CUDA=OFF)
foreach(p IN LISTS optional_packages)
  list(APPEND no_optional -DCMAKE_DISABLE_FIND_PACKAGE_${p}=ON)
endforeach()

# run(<name> <expect: ok|fail> <configure args...>): configure, build and run the consumer in
# WORK/<name>. With `fail`, the configuration must fail; its output is left in `configure_output`.
function(run name expect)
  set(dir ${WORK}/${name})
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE}/tests/consumer -B ${dir} "-DCMAKE_BUILD_TYPE=" ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(configure_output "${out}${err}" PARENT_SCOPE)
  if(expect STREQUAL "fail")
    if(rc EQUAL 0)
      message(FATAL_ERROR "consumer (${name}): configuring succeeded, a failure was expected")
    endif()
    return()
  endif()
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer (${name}) configure failed:\n${out}\n${err}")
  endif()
  foreach(step build run)
    if(step STREQUAL "build")
      set(cmd ${CMAKE_COMMAND} --build ${dir} --target consumer)
    else()
      set(cmd ${dir}/consumer)
    endif()
    execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "consumer (${name}) ${step} failed:\n${out}\n${err}")
    endif()
  endforeach()
  message(STATUS "consumer (${name}): ${out}")
endfunction()

# 1. Install into a clean prefix.
set(prefix ${WORK}/prefix)
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD} --prefix ${prefix} RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "install failed")
endif()
file(GLOB installed_cmake ${prefix}/*/cmake/moe/moe*.cmake)
if(NOT installed_cmake)
  message(FATAL_ERROR "no moe*.cmake installed under ${prefix}/*/cmake/moe")
endif()
foreach(f IN LISTS installed_cmake)
  file(READ ${f} text)
  string(REGEX REPLACE "#[^\n]*" "" text "${text}")  # comments may name paths
  foreach(path "/usr/" "/opt/" "${SOURCE}" "${BUILD}" "${prefix}")
    string(FIND "${text}" "${path}" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "${f} holds the absolute path '${path}': the package would not move")
    endif()
  endforeach()
endforeach()

# 2. Core only: nothing but a C++20 compiler (and threads).
run(core ok -DCMAKE_PREFIX_PATH=${prefix} ${no_optional})
file(STRINGS ${WORK}/core/CMakeCache.txt searched REGEX "^(CUDAToolkit|NCCL|MPI|nlohmann_json|yaml-cpp|MOE_LIBZIP)[A-Za-z_-]*:")
if(searched)
  message(FATAL_ERROR "consumer (core): find_package(moe) looked for optional packages: ${searched}")
endif()

# 3. Each component, as this machine allows.
foreach(c cuda nccl mpi interop)
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE}/tests/consumer -B ${WORK}/probe-${c} -DCMAKE_PREFIX_PATH=${prefix}
                          -DMOE_COMPONENTS=${c} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0)
    run(component-${c} ok -DCMAKE_PREFIX_PATH=${prefix} -DMOE_COMPONENTS=${c})
  elseif("${out}${err}" MATCHES "moe: component ${c} needs ([^\n]*)")
    message(STATUS "consumer (component-${c}): not available on this machine, as find_package says: ${CMAKE_MATCH_0}")
  else()
    message(FATAL_ERROR "consumer (component-${c}) failed without naming the missing package:\n${out}\n${err}")
  endif()
endforeach()

# 4. A required component whose package is missing, and an unknown component.
run(mpi-disabled fail -DCMAKE_PREFIX_PATH=${prefix} -DMOE_COMPONENTS=mpi -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON)
if(NOT configure_output MATCHES "moe: component mpi needs MPI for C\\+\\+ \\(MPI\\), which was not found")
  message(FATAL_ERROR "consumer (mpi-disabled): no message naming MPI:\n${configure_output}")
endif()
run(interop-disabled fail -DCMAKE_PREFIX_PATH=${prefix} -DMOE_COMPONENTS=interop -DCMAKE_DISABLE_FIND_PACKAGE_yaml-cpp=ON)
if(NOT configure_output MATCHES "moe: component interop needs yaml-cpp \\(Debian: libyaml-cpp-dev\\)")
  message(FATAL_ERROR "consumer (interop-disabled): no message naming yaml-cpp:\n${configure_output}")
endif()
run(unknown-component fail -DCMAKE_PREFIX_PATH=${prefix} -DMOE_COMPONENTS=cudaa)
if(NOT configure_output MATCHES "moe: unknown component 'cudaa' \\(known: cuda, nccl, mpi, interop\\)")
  message(FATAL_ERROR "consumer (unknown-component): no message naming the component:\n${configure_output}")
endif()
message(STATUS "consumer: a missing or unknown component is named: ok")

# 5. From the source tree: add_subdirectory, and FetchContent from a local archive.
run(subdirectory ok -DMOE_SOURCE_DIR=${SOURCE} ${no_optional})
execute_process(COMMAND ${CMAKE_COMMAND} -E tar czf ${WORK}/moe-source.tar.gz CMakeLists.txt cmake include LICENSE
                WORKING_DIRECTORY ${SOURCE} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "could not pack the source tree")
endif()
run(fetchcontent ok -DMOE_FETCH_URL=file://${WORK}/moe-source.tar.gz -DFETCHCONTENT_QUIET=ON ${no_optional})
