#pragma once
// FinDEP planning: performance models, problem and configurations, simulator, closed-form
// evaluator, solver and the PPPipe baseline. See docs/findep.md.

#include "moe/schedule/evaluate.hpp"
#include "moe/schedule/perf_model.hpp"
#include "moe/schedule/problem.hpp"
#include "moe/schedule/simulator.hpp"
#include "moe/schedule/solver.hpp"
