# nvcc at the library's C++20, after enable_language(CUDA): included by the main build and by the
# Python package's device library (python/CMakeLists.txt, MOE_COMPOSE_CUDA).
if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  # CMake < 3.26 knows nvcc's dialect flags only up to C++17; nvcc 12+ accepts -std=c++20.
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
