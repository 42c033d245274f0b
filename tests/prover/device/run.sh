#!/bin/sh
# One device session's whole check, in one call of the device tool (docs/benchmarks.md, "The device check"):
#   carry [".device-deps"] (tomli-w and tenacity wheels: `pip download --no-deps -d .device-deps tomli-w tenacity`),
#   command: sh tests/prover/device/run.sh [machine nvml held stall demo cgroup2]   (no names: every step)
# The machine has python3, psutil, nvidia-ml-py and PyTorch of its own; the log comes back as $OUT/device.log.
set -u
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device-deps/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
D=tests/prover/device

machine() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -m pip show nvidia-ml-py psutil 2>/dev/null | grep -E '^(Name|Version)'
  python3 --version; uname -r; nproc; free -g; grep -w cgroup2 /proc/self/mountinfo; cat /proc/self/cgroup
}
nvml() { timeout 120 python3 $D/nvml_check.py --event-wait-s 10; }
held() {  # GPU 0 held by another process: fitness must refuse it, naming its pid
  rm -f /tmp/held
  python3 -c "import os, pathlib, time, torch
x = torch.ones(1 << 28, device='cuda'); torch.cuda.synchronize()
pathlib.Path('/tmp/held').write_text(str(os.getpid())); time.sleep(150)" &
  holder=$!
  for _ in $(seq 120); do [ -e /tmp/held ] && break; sleep 0.5; done
  echo "holder pid $holder (it says $(cat /tmp/held 2>/dev/null || echo 'not ready'))"
  timeout 90 python3 $D/nvml_check.py --event-wait-s 1
  kill "$holder"; wait "$holder" 2>/dev/null
}
stall() { timeout 240 python3 $D/stall_check.py --busy-s 25 --stall-s 8; }
demo() {
  timeout 120 python3 -m supervisor demo >"$OUT/demo.log" 2>&1; echo "demo exit $?"
  grep -E '\[supervisor\]|^demo' "$OUT/demo.log" | cut -c1-240
}
cgroup2() { timeout 300 python3 $D/cgroup2_check.py; }

for step in ${*:-machine nvml held stall demo cgroup2}; do
  echo "== $step"
  $step
done 2>&1 | tee "$OUT/device.log"
