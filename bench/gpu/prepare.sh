#!/usr/bin/env bash
# Run here (on the CPU machine) before calling run_device.sh through the device tool: copies what
# the GPU machine lacks and cannot fetch into .device/ (ignored by git, named in the call's
# `carry`): nlohmann/json's header from Debian's package.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
mkdir -p "$root/.device/include"
cp -r /usr/include/nlohmann "$root/.device/include/"
grep -qx '/.device/' "$root/.git/info/exclude" 2>/dev/null || echo '/.device/' >> "$root/.git/info/exclude"
du -sh "$root/.device"
