#pragma once
// moe-compose: one include for everything this translation unit can compile. Host C++ gets the host
// execution paths of moe::Layer and every planner; nvcc also gets the device paths and the CUDA
// kernels. Backends with dependencies of their own are included separately: moe/collective/mpi.hpp
// (MPI), moe/collective/nccl.hpp (CUDA + NCCL), moe/speculative/cocluster_metis.hpp (METIS), and the
// engine formats of moe/interop/ (target moe::interop: nlohmann-json, yaml-cpp, libzip).
// The order below is the layering of docs/architecture.md, bottom first.

#include "moe/config.hpp"

// core, models, plan: shapes, RNG, weight views, workspace; model shapes; the shared plan vocabulary.
#include "moe/core/bf16.hpp"
#include "moe/core/rng.hpp"
#include "moe/core/shape.hpp"
#include "moe/core/tsv.hpp"
#include "moe/core/weights.hpp"
#include "moe/core/workspace.hpp"
#include "moe/models/models.hpp"
#include "moe/plan/placement_table.hpp"
#include "moe/plan/plan_io.hpp"
#include "moe/plan/replica_table.hpp"
#include "moe/plan/slot_map.hpp"

// Routers, profiles, topologies.
#include "moe/router/router.hpp"
#include "moe/profile/load_profile.hpp"
#include "moe/profile/olmoe_tokens.hpp"
#include "moe/profile/route_profile.hpp"
#include "moe/profile/route_split.hpp"
#include "moe/profile/route_synthetic.hpp"
#include "moe/profile/token_batches.hpp"
#include "moe/topology/topology.hpp"
#include "moe/topology/presets.hpp"

// Offline planners: placement (heuristics, ILP/ILPLoad, the joint planner, the traffic model) and
// replication (EPLB, CRAFT, routed and batch-reactive policies).
#include "moe/placement/problem.hpp"
#include "moe/placement/heuristics.hpp"
#include "moe/placement/network_simplex.hpp"
#include "moe/placement/ilp.hpp"
#include "moe/topology/traffic.hpp"
#include "moe/placement/eplb_packing.hpp"
#include "moe/placement/metrics.hpp"
#include "moe/placement/joint.hpp"
#include "moe/replication/eplb.hpp"
#include "moe/replication/craft.hpp"
#include "moe/replication/routed.hpp"
#include "moe/replication/reactive.hpp"

// Speculative MoE: predictors, s-EG co-clustering, shuffle plans, metrics.
#include "moe/speculative/cocluster.hpp"
#include "moe/speculative/predictor.hpp"
#include "moe/speculative/table_io.hpp"
#include "moe/speculative/shuffle_plan.hpp"
#include "moe/speculative/metrics.hpp"
#include "moe/speculative/capped_eval.hpp"
#include "moe/speculative/comm_volume.hpp"

// FinDEP / PPPipe: schedule policies, performance models, solver, simulator.
#include "moe/schedule/sequential.hpp"
#include "moe/schedule/disaggregated.hpp"
#include "moe/schedule/findep.hpp"

// Collectives and host kernels.
#include "moe/collective/concept.hpp"
#include "moe/collective/in_process.hpp"
#include "moe/collective/single_gpu.hpp"
#include "moe/kernels/host.hpp"

// moe::Layer and its host execution paths; the reference forward pass; the s-MoE shuffled layer.
#include "moe/layer/layer.hpp"
#include "moe/layer/paths/host.hpp"
#include "moe/layer/paths/host_disaggregated.hpp"
#include "moe/layer/reference.hpp"
#include "moe/layer/shuffled.hpp"

#if defined(__CUDACC__) || defined(MOE_CUDA_EMULATOR)
// The device execution paths: nvcc, or the CPU emulator of tests/emu, which compiles CUDA sources
// as C++ and defines MOE_CUDA_EMULATOR.
#include "moe/layer/paths/device.cuh"
#include "moe/layer/paths/device_disaggregated.cuh"
#endif
