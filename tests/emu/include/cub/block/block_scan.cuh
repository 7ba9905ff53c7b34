#pragma once
// moe-emu: stands in for CUB (tests only).
#include "emu/cub.hpp"
