#pragma once
// moe-emu: stands in for NCCL (tests only): ranks are threads of this process.
#include "emu/nccl.hpp"
