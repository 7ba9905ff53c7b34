# The README's usage example compiles as written: the first ```cpp block after "## Usage" is cut out
# of README.md into a translation unit and compiled (syntax and templates, no link) with the flags
# of a program that uses moe::moe and moe::mpi.
#   cmake -DREADME=<README.md> -DOUT=<file.cpp> -DCXX=<compiler> "-DFLAGS=<flag;...>" -P check.cmake
file(READ ${README} text)
string(FIND "${text}" "## Usage" at)
if(at EQUAL -1)
  message(FATAL_ERROR "readme_usage: README.md has no '## Usage' section")
endif()
string(SUBSTRING "${text}" ${at} -1 text)
string(FIND "${text}" "```cpp\n" begin)
if(begin EQUAL -1)
  message(FATAL_ERROR "readme_usage: the Usage section has no ```cpp block")
endif()
math(EXPR begin "${begin} + 7")
string(SUBSTRING "${text}" ${begin} -1 text)
string(FIND "${text}" "```" end)
string(SUBSTRING "${text}" 0 ${end} code)
file(WRITE ${OUT} "${code}")
execute_process(COMMAND ${CXX} -std=c++20 -fsyntax-only -Wall -Wextra ${FLAGS} ${OUT}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "readme_usage: the README's usage example does not compile:\n${out}")
endif()
message(STATUS "readme_usage: ok")
