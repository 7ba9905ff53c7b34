#pragma once
// moe-emu: stands in for the CUDA runtime header (tests only).
#include "emu/runtime.hpp"
