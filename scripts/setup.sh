#!/usr/bin/env bash
# Sets up everything Terra needs on a Debian 12 machine, idempotently: Debian packages, the venv at
# .venv, the CMake build in build/, and the install of the kernel, the `terra` Python package and
# the `terra` kernel spec into that venv. On a machine that is already set up it only rebuilds what
# changed and prints nothing from apt or pip.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# Build tools, the kernel stack (xeus 2.4.1, xeus-python 0.14.3 and its IPython shell), JSON,
# GoogleTest, SQLite for the history store, Chromium for browser tests.
debs=(build-essential cmake make python3-venv python3-dev
      xeus-dev xeus-python-dev libxeus-python0 python3-xeus-python-shell python3-ipython
      python3-debugpy pybind11-dev pybind11-json-dev nlohmann-json3-dev cppzmq-dev
      libgtest-dev libgmock-dev libsqlite3-dev chromium)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo_cmd=(); [ "$(id -u)" = 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

venv="$root/.venv"
if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating $venv from /usr/bin/python3"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
stamp="$venv/.terra-requirements"
want="$(cat requirements.txt constraints.txt bench/requirements-hf.txt | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing Python packages into $venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r requirements.txt -c constraints.txt
  echo "$want" > "$stamp"
fi

build="$root/build"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release \
        -DPython_EXECUTABLE="$venv/bin/python" -DCMAKE_INSTALL_PREFIX="$venv" \
        -DTERRA_WERROR="${TERRA_WERROR:-OFF}" > "$build.configure.log" 2>&1 \
    || { cat "$build.configure.log"; exit 1; }
elif [ -n "${TERRA_WERROR:-}" ]; then
  cmake -B "$build" -DTERRA_WERROR="$TERRA_WERROR" > /dev/null
fi
cmake --build "$build" -j "$(nproc)" > "$build/build.log" 2>&1 \
  || { grep -vE '^\[ *[0-9]+%\]' "$build/build.log" | tail -n 60; echo "setup: build failed (full log: $build/build.log)"; exit 1; }
cmake --install "$build" > /dev/null
