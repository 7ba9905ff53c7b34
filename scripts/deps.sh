# Sourced by the other scripts: installs the Debian packages moe-compose builds and tests with,
# when they are missing. Nothing is fetched from anywhere but the Debian archive.
MOE_DEBIAN_PACKAGES=(cmake g++ make catch2 libbenchmark-dev libopenmpi-dev openmpi-bin
                     liblemon-dev libglpk-dev libmetis-dev nlohmann-json3-dev
                     libyaml-cpp-dev libzip-dev python3 python3-pip)

moe_install_missing_packages() {
  local missing=()
  for p in "${MOE_DEBIAN_PACKAGES[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    return 0
  fi
  echo "moe: installing missing Debian packages: ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# Python packages the tests use (from PyPI when the python3 on PATH lacks them): PyYAML, the
# independent reader of the TensorRT-LLM plan files in tests/planners/engine_load_check.py.
moe_install_missing_python_packages() {
  python3 -c "import yaml" >/dev/null 2>&1 && return 0
  echo "moe: installing missing Python packages: pyyaml"
  python3 -m pip install -q pyyaml || python3 -m pip install -q --break-system-packages pyyaml
}

moe_jobs() {
  nproc 2>/dev/null || echo 2
}
