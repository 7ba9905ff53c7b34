#pragma once
// moe-compose: one include for everything host-side. Backends with their own dependencies are
// included separately: moe/collective/mpi.hpp (MPI), moe/collective/nccl.hpp (CUDA + NCCL), and
// the CUDA kernels in moe/kernels/*.cuh (nvcc).

#include "moe/config.hpp"
#include "moe/core/bf16.hpp"
#include "moe/core/shape.hpp"
#include "moe/core/tsv.hpp"
#include "moe/core/workspace.hpp"
#include "moe/models/models.hpp"
#include "moe/router/router.hpp"
#include "moe/placement/table.hpp"
#include "moe/replication/table.hpp"
#include "moe/schedule/sequential.hpp"
#include "moe/collective/concept.hpp"
#include "moe/collective/in_process.hpp"
#include "moe/kernels/host.hpp"
#include "moe/layer/weights.hpp"
#include "moe/layer/reference.hpp"
#include "moe/layer/layer.hpp"
#include "moe/layer/shuffled.hpp"
