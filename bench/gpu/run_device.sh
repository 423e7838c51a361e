#!/usr/bin/env bash
# One prepared run on the lent GPU machine (torch with CUDA already installed there, no registries,
# no xeus): builds the engine alone (kernel and GoogleTests off) against that machine's torch,
# runs the engine tests and the CUDA tests, then the GPU benchmark; everything it reports goes to
# $OUT (the device tool brings it back). Meant to finish within 9 minutes: build, CUDA tests, the
# benchmark, then the engine's tests under that machine's Python and torch.
#
#   here:   bash bench/gpu/prepare.sh
#   device: run(command="bash bench/gpu/run_device.sh", carry=[".device"], timeout_s=540)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${OUT:-$root/.device/out}"
mkdir -p "$out"
log="$out/run_device.log"
exec > >(tee "$log") 2>&1
start=$(date +%s)
py="$(command -v python3)"
echo "== machine"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$py" -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.is_available())"
ls "$("$py" -c "import sysconfig; print(sysconfig.get_paths()['include'])")/internal/pycore_frame.h" || true; nproc

echo "== build (kernel off)"
build=/tmp/terra-build
prefix=/tmp/terra-install
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DTERRA_BUILD_KERNEL=OFF \
  -DTERRA_BUILD_TESTS=OFF -DPython_EXECUTABLE="$py" -DTERRA_JSON_INCLUDE="$root/.device/include" \
  -DCMAKE_INSTALL_PREFIX="$prefix" || exit 1
keep=(); [ ${#gen[@]} -gt 0 ] && keep=(-- -k 0)  # ninja: every compile error in one run
cmake --build "$build" -j "$(nproc)" "${keep[@]}" || exit 1
cmake --install "$build" > /dev/null || exit 1
site="$("$py" -c "import sysconfig; print(sysconfig.get_path('purelib', vars={'base': '$prefix', 'platbase': '$prefix'}))")"
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
echo "build done after $(( $(date +%s) - start )) s"

cd "$root"
status=0
echo "== CUDA tests"
PYTHONUNBUFFERED=1 timeout 120 "$py" -m pytest -q -p no:cacheprovider tests/python/test_cuda.py \
  --junitxml="$out/tests_cuda.xml" || status=$?
echo "CUDA tests done after $(( $(date +%s) - start )) s (status $status)"

# The engine's own tests on that machine's Python and torch (another version than here): first
# the two that crashed, each in a process of its own (under gdb where it is there), last the rest.
echo "== crashing engine tests"
# (Two tests crashed there on 2026-12-04, under torch 2.11 and Python 3.12: run apart, after the
# others, each in a process of its own.)
crashes=(tests/python/test_engine.py::test_gradient_accumulation_order_matches_eager_across_threads
         tests/python/test_engine.py::test_a_loop_that_never_becomes_steady_is_explained_at_the_op_that_changes)
for t in "${crashes[@]}"; do
  if command -v gdb > /dev/null; then  # the native stack of a crash, not only Python's
    PYTHONUNBUFFERED=1 timeout 60 gdb -q -batch -ex "set pagination off" -ex run -ex "bt 40" \
      --args "$py" -m pytest -q -p no:cacheprovider "$t" 2>&1 | grep -v "^\[New Thread\|^\[Thread .* exited" | tail -60
  else
    PYTHONUNBUFFERED=1 timeout 20 "$py" -X faulthandler -m pytest -q -p no:cacheprovider "$t" 2>&1 | tail -30 || status=$?
  fi
done

echo "== benchmark"
# One process per (program, mode) beside eager; a process that dies (a device-side assert ends its
# CUDA context) is recorded as failed and run again for 20 steps with CUDA_LAUNCH_BLOCKING=1, so
# its traceback names the op.
# GPU_MODES: the modes to measure beside eager (the peers' rows are in bench/results/gpu_bench.md
# from session 24; a session short of device time measures Terra's alone).
for mode in ${GPU_MODES:-terra terra_noreplay cuda_graph compile}; do  # compile's warm-up is the slowest: last
  for prog in mlp tiny_lm rnn_python chain; do
    [ "$mode" = cuda_graph ] && [ "$prog" = rnn_python ] && continue  # not static
    limit=45; [ "$mode" = compile ] && limit=90
    PYTHONUNBUFFERED=1 timeout $limit "$py" bench/gpu/bench.py --out "$out" --program $prog --modes $mode \
      --steps 200 --rounds 3 > "$out/last.log" 2>&1
    rc=$?
    grep -v "^--" "$out/last.log" | tail -3
    if [ $rc -ne 0 ]; then
      status=1
      echo "!! $prog $mode failed (rc $rc); last lines:"; grep -v "Loss.cu\|IndexKernel.cu" "$out/last.log" | tail -8
      "$py" bench/gpu/bench.py --out "$out" --program $prog --modes $mode --failed
      [ $rc -ne 124 ] && CUDA_LAUNCH_BLOCKING=1 PYTHONUNBUFFERED=1 timeout 60 "$py" bench/gpu/bench.py --out /tmp/diag \
        --program $prog --modes $mode --steps 20 --rounds 1 2>&1 | grep -v "Loss.cu\|IndexKernel.cu" | tail -25
    fi
    echo "   ($prog $mode: $(( $(date +%s) - start )) s)"
  done
done
"$py" bench/gpu/bench.py --out "$out" --steps 200 --rounds 3 || status=$?
rm -f "$out/last.log"
echo "benchmark done after $(( $(date +%s) - start )) s (status $status)"

echo "== engine tests"
PYTHONUNBUFFERED=1 timeout 80 "$py" -m pytest -q -p no:cacheprovider -rf tests/python/test_engine.py \
  tests/python/test_export.py "${crashes[@]/#/--deselect=}" --junitxml="$out/tests_engine.xml" || status=$?
echo "== total $(( $(date +%s) - start )) s, status $status"
exit $status
