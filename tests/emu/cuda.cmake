# The project's CUDA tests (tests/cuda/*.cu), unmodified, on the emulator. Label emu; the kernel
# and stream tests also carry emu_tsan (run under ThreadSanitizer by `scripts/test.sh --tsan`).
moe_emu_cuda_test(NAME test_cuda_kernels_emu SOURCE test_cuda_kernels.cu LABELS emu_tsan)
moe_emu_cuda_test(NAME test_cuda_shuffle_emu SOURCE test_cuda_shuffle.cu LABELS emu_tsan)
moe_emu_cuda_test(NAME test_cuda_layer_emu SOURCE test_cuda_layer.cu)
moe_emu_cuda_test(NAME test_findep_cuda_emu SOURCE test_findep_cuda.cu LABELS emu_tsan)
moe_emu_cuda_test(NAME test_cuda_instantiate_emu SOURCE test_cuda_instantiate.cu)
