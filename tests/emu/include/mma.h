#pragma once
// moe-emu: stands in for <mma.h> (tests only).
#include "emu/wmma.hpp"
