#!/usr/bin/env bash
# The engines' own EPLB code with moe_compose's drop-in policies (issue 34; docs/engines.md, "The
# engines' own code in CI"). Installs, into a virtual environment of its own (by default
# ~/.cache/moe-compose/engine-check-venv, outside the checkout so that fresh clones reuse it;
# MOE_ENGINE_VENV chooses another), torch and the vLLM 0.34.0 and SGLang 0.5.23 wheels from PyPI without their
# dependencies, plus the pure-Python modules their EPLB code imports, then runs
#   tests/engines/sglang_eplb.py      SGLang's rebalance_experts vs ours, int/float32/float16/bfloat16
#   benchmarks/python/sglang_lp_dispatch.py --check
#                                     SGLang's per-batch LP dispatch and static dispatch (its CPU
#                                     references) vs moe_compose.BatchSplit on seeded batches
#   tests/engines/vllm_rearrange.py   vLLM's rearrange_expert_weights_inplace on 4 gloo processes:
#                                     steady state, elastic scale-down and scale-up, ours vs default
# Nothing of the engines is copied into this repository.
#
#   scripts/engine_check.sh            install what is missing, then run both programs
#   scripts/engine_check.sh --prepare  install what is missing and stop (.ci/run starts this in the
#                                      background at its beginning, so that the download and unpacking
#                                      wait on the network and the disk while the other stages compile)
#
# torch: PyPI has only the CUDA build of torch 2.15.0 for x86-64 Linux (the CPU-only index is not
# reachable from CI). Its smallest working install found here is the torch wheel plus four of its
# CUDA libraries that the machine's CUDA 13.0 toolkit (/usr/local/cuda) lacks or has too old:
# cuFile, cuSPARSELt, NVSHMEM, NCCL 2.30 (about 1.1 GB of wheels, 4.4 GB installed with triton;
# first run 625 s, 494 s of it installing, from a warm pip cache; with the environment in place
# about 2 minutes, 2026-11-27 on the 2-core CI machine). On a machine without the CUDA toolkit,
# `pip install torch==2.15.0` with its dependencies works instead (about 3 GB more).
set -euo pipefail
cd "$(dirname "$0")/.."
prepare_only=0
case "${1:-}" in
  "") ;;
  --prepare) prepare_only=1 ;;
  *) echo "engine_check.sh: unknown argument '$1' (the only one is --prepare)" >&2; exit 2 ;;
esac
venv=${MOE_ENGINE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/moe-compose/engine-check-venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py=$venv/bin/python
pipi() { "$py" -m pip install -q --disable-pip-version-check "$@"; }

torch_pkgs=(torch==2.15.0 nvidia-cufile==1.20.0.107 nvidia-cusparselt-cu13==0.8.1 nvidia-nvshmem-cu13==3.7.2
            nvidia-nccl-cu13==2.30.7 triton==3.9.0)
engine_pkgs=(vllm==0.34.0 sglang==0.5.23)
# What `import vllm.distributed.eplb.eplb_state, ...rebalance_execute` and
# `import sglang.srt.eplb.expert_location` need (found by importing until nothing was missing).
python_pkgs=(aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 annotated-doc==0.0.7 annotated-types==0.8.0
  anyio==4.16.0 apache-tvm-ffi==0.1.15.post2 attrs==26.1.0 cachetools==8.0.2 cbor2==6.3.0 certifi==2026.10.19.post1
  cloudpickle==3.1.3 fastapi==0.165.0 filelock==4.3.1 frozenlist==1.8.0 fsspec==2026.9.0 h11==0.16.0 httpcore2==2.16.2
  httpx2==2.16.2 huggingface_hub==2.4.0 idna==3.20 ipython==9.18.1 Jinja2==3.1.6 llguidance==1.9.1 MarkupSafe==3.0.4
  mpmath==1.4.1 msgspec==0.22.0 multidict==7.2.1 networkx==3.6.1 numpy==2.4.6 openai==3.57.0 openai-harmony==0.0.8
  opentelemetry-api==1.45.2 orjson==3.13.0 packaging==26.4 partial-json-parser==0.2.1.1.post7 pillow==13.0.0
  prometheus_client==0.26.0 propcache==0.5.4 psutil==7.2.2 py-cpuinfo==9.0.0 pybase64==1.5.1 pydantic==2.14.4
  pydantic_core==2.50.5 Pygments==2.21.0 PyYAML==6.0.4 pyzmq==27.3.0 regex==2026.11.19 requests==2.34.2
  safetensors==0.8.0 sniffio==1.3.1 starlette==1.10.0 sympy==1.14.0 tokenizers==0.23.3 tqdm==4.70.1 traitlets==5.16.1
  transformers==5.24.0 truststore==0.10.5 typing-inspection==0.4.5 typing_extensions==4.16.0 urllib3==2.8.0
  uvloop==0.23.0 xgrammar==0.2.8 yarl==1.25.1)
s=$(date +%s)
pipi --no-deps "${torch_pkgs[@]}" "${engine_pkgs[@]}" "${python_pkgs[@]}" scikit-build-core nanobind pathspec
if [ "$prepare_only" = 1 ]; then
  echo "engine_check: the engines' packages ready in $(( $(date +%s) - s )) s ($venv)"
  exit 0
fi
# moe_compose from this checkout: the wheel scripts/test.sh left in python/build/dist/ while no file
# of python/ or include/ is newer than it (a run of .ci/run: the test stage made it from the same
# tree), else built here. A build here compiles the extension again even after test.sh's, since
# this environment's nanobind sources lie at another path than the system Python's: 28-44 s from a
# cold compiler cache, a few seconds from test.sh's launcher's cache entries of an earlier run.
wheel=$(ls python/build/dist/moe_compose-*.whl 2>/dev/null | head -n 1 || true)
if [ -n "$wheel" ] && [ -z "$(find python include -path python/build -prune -o -type f -newer "$wheel" -print | head -n 1)" ] &&
   pipi --no-deps --force-reinstall "$wheel"; then
  echo "engine_check: moe_compose from test.sh's wheel ($wheel)"
else
  source scripts/deps.sh
  moe_use_ccache
  CMAKE_ARGS="${CMAKE_ARGS:-} ${MOE_CMAKE_LAUNCHER[*]}" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
    pipi --no-deps --no-build-isolation --force-reinstall ./python
fi
echo "engine_check: environment ready in $(( $(date +%s) - s )) s"
export PYTHONWARNINGS=ignore
s=$(date +%s)
"$py" tests/engines/sglang_eplb.py
"$py" benchmarks/python/sglang_lp_dispatch.py --check
echo "engine_check: SGLang in $(( $(date +%s) - s )) s"
s=$(date +%s)
"$py" tests/engines/vllm_rearrange.py
echo "engine_check: vLLM in $(( $(date +%s) - s )) s"
