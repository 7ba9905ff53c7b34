#pragma once
// moe-emu: stands in for cuBLAS (tests only).
#include "emu/cublas.hpp"
