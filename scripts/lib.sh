# Shared by scripts/run, scripts/test and .ci/run: install missing Debian packages, configure
# and build (reusing an existing build directory).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JOBS="${JOBS:-$(nproc)}"

# Debian packages the build needs (a fresh machine has the compiler, cmake and GoogleTest only).
ATTOGRAD_PACKAGES=(cmake g++ make libeigen3-dev libcereal-dev libgtest-dev libcli11-dev nlohmann-json3-dev
  libxxhash-dev)

ensure_packages() {
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
