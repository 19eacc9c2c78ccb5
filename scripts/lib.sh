# Shared by scripts/run, scripts/test and .ci/run: install missing Debian packages, configure
# and build (reusing an existing build directory).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JOBS="${JOBS:-$(nproc)}"

# Debian packages the build needs (a fresh machine has the compiler, cmake and GoogleTest only). Open MPI builds the
# data-parallel trainer and lets the tests run it under mpirun (docs/DISTRIBUTED.md); the build works without it.
# pkgconf finds SentencePiece (libsentencepiece-dev ships a .pc file, no CMake config: cmake/FindSentencePiece.cmake).
ATTOGRAD_PACKAGES=(cmake g++ make pkgconf libeigen3-dev libcereal-dev libgtest-dev libcli11-dev nlohmann-json3-dev
  libxxhash-dev libsentencepiece-dev openmpi-bin libopenmpi-dev)

# Optional: headless Chromium for the browser test of the attention explorer (tests/cli/test_cli_view.cpp) and a
# small CJK font for its screenshot; when they cannot be installed the test skips and says so.
ATTOGRAD_OPTIONAL_PACKAGES=(chromium fonts-wqy-microhei)

ensure_packages() {
  ensure_optional_packages
  local missing=()
  for p in "${ATTOGRAD_PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "==> installing Debian packages: ${missing[*]}"
  local SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  if ! $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1; then
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

# Installs what is missing of ATTOGRAD_OPTIONAL_PACKAGES; a failure is a warning, not an error.
ensure_optional_packages() {
  local missing=()
  for p in "${ATTOGRAD_OPTIONAL_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "==> installing optional Debian packages: ${missing[*]}"
  local SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1; then
    $SUDO apt-get update -qq >/dev/null 2>&1 || true
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 ||
      echo "==> warning: could not install ${missing[*]}: the browser test will skip"
  fi
  return 0
}

# configure_and_build BUILD_DIR [cmake args...]
configure_and_build() {
  local dir="$1"
  shift
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    echo "==> configuring $dir"
    cmake -S "$ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
  else
    cmake -S "$ROOT" -B "$dir" "$@" >/dev/null
  fi
  echo "==> building $dir ($JOBS jobs)"
  cmake --build "$dir" -j "$JOBS"
}

# The kernel sets (ATTOGRAD_CPU values) this CPU can run, best first, by the rule the library itself picks with
# (autograd/cpu.cpp): avx2 needs AVX2, FMA, BMI1 and BMI2, avx512 also AVX-512 F, BW, CD, DQ and VL. The other
# x86-64-v3 features (F16C, MOVBE, LZCNT) come with every such CPU, but a virtual machine may leave one out of
# /proc/cpuinfo: the Zen 5 VM of 2026-11-28 listed no "abm" (LZCNT), and requiring it ran the suite under generic only.
# ATTOGRAD_CPU_SETS overrides the list (e.g. ATTOGRAD_CPU_SETS=generic).
kernel_sets() {
  if [ -n "${ATTOGRAD_CPU_SETS:-}" ]; then
    echo "$ATTOGRAD_CPU_SETS"
    return
  fi
  local flags sets=""
  flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
  has() { for f in "$@"; do [[ "$flags" == *" $f "* ]] || return 1; done; }
  if [ "$(uname -m)" = "x86_64" ]; then
    if has avx2 fma bmi1 bmi2; then
      has avx512f avx512bw avx512cd avx512dq avx512vl && sets="avx512 "
      sets+="avx2 "
    fi
  fi
  echo "${sets}generic"
}

# run_suite BUILD_DIR [ctest args...]: the suite once per kernel set this CPU runs.
run_suite() {
  local dir="$1"
  shift
  for set in $(kernel_sets); do
    echo "==> running tests with ATTOGRAD_CPU=$set ($dir)"
    ATTOGRAD_CPU="$set" ctest --test-dir "$dir" --output-on-failure -j "$JOBS" "$@"
  done
}

