#!/usr/bin/env bash
# One prepared check on a host with a real NVIDIA GPU (issue 13, "On a real GPU").
#
# Records what the host prints (nvidia-smi -q, -q -x, -L, nvlink -s, topo -m), then runs
# the runner on it: inventory (NVML, and --simulate of the fresh recording, which must
# agree), doctor, a benchmark (--no-post: nothing is sent anywhere), one health reading,
# and -- only when asked (GPU_CHECK_MIG_LAYOUT=1) and MIG mode is already Enabled with no
# GPU instance -- a MIG layout made and removed again. Every step is time-limited; the GPU
# is never reset and its MIG mode never changed. A summary ends the output.
#
# Usage, from a fresh checkout, with python3 (and pip) only:
#   scripts/gpu-check.sh                       # writes into $OUT, else /tmp/gpu-check-out
#   GPU_CHECK_MIG_LAYOUT=1 scripts/gpu-check.sh   # also try the MIG layout (root)
# Environment: OUT (output folder), GPU_CHECK_WHEELS (a folder of wheels for an offline
# host: docker, websockets, ... whatever python3 lacks), GPU_CHECK_PYTHON (use this
# interpreter as it is: no venv, no install), GPU_CHECK_MIG_PROFILES (default
# "1g.18gb,1g.18gb": profile names for `nvidia-smi mig -cgi`; H100 80GB: 1g.10gb).
# At most 8 files land in the output folder (what a lent machine sends back).
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${OUT:-/tmp/gpu-check-out}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$repo" || exit 2  # the checkout's code is what runs (python -m providers.runner)
log="$out/gpu-check.log"
: >"$log"
summary=()

say() { printf '%s\n' "$*" | tee -a "$log"; }

# step NAME SECONDS COMMAND...: run with a time limit, output to the log, note rc and time.
step() {
  local name="$1" limit="$2" start rc
  shift 2
  say "== $name (limit ${limit}s): $*"
  start=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  local took=$(( $(date +%s) - start ))
  case $rc in
    0) summary+=("PASS  $name (${took}s)") ;;
    124|137) summary+=("TIME  $name: stopped after ${limit}s") ;;
    *) summary+=("FAIL  $name: exit $rc (${took}s), see gpu-check.log") ;;
  esac
  say "-- $name: exit $rc in ${took}s"
  return $rc
}

# record NAME FILE SECONDS COMMAND...: like step, the command's stdout into FILE.
record() {
  local name="$1" file="$2" limit="$3" rc
  shift 3
  say "== $name (limit ${limit}s): $* > $(basename "$file")"
  timeout --kill-after=10 "$limit" "$@" >"$file" 2>>"$log"
  rc=$?
  if [ $rc -eq 0 ]; then
    summary+=("PASS  $name: $(basename "$file"), $(wc -l <"$file") lines")
  else
    summary+=("FAIL  $name: exit $rc")
    [ -s "$file" ] || rm -f "$file"
  fi
  return $rc
}

# shellcheck disable=SC2329  # invoked by the EXIT trap
finish() {
  say ""
  say "== summary ($(date -u +%Y-%m-%dT%H:%M:%SZ), output in $out)"
  local line
  for line in "${summary[@]}"; do say "$line"; done
}
trap finish EXIT

say "gpu-check on $(hostname) at $(date -u +%Y-%m-%dT%H:%M:%SZ), repo $repo"
if ! command -v nvidia-smi >/dev/null 2>&1; then
  summary+=("FAIL  nvidia-smi: not on PATH (no NVIDIA driver here)")
  exit 2
fi

# 1. What the host prints. File names pair up for --simulate (docs/RUNNER.md).
record "nvidia-smi -q" "$out/host.q.txt" 60 nvidia-smi -q
record "nvidia-smi -q -x" "$out/host.q.xml" 60 nvidia-smi -q -x
record "nvidia-smi -L" "$out/host.L.txt" 30 nvidia-smi -L
record "nvidia-smi nvlink -s" "$out/host.nvlink.txt" 30 nvidia-smi nvlink -s
record "nvidia-smi topo -m" "$out/host.topo.txt" 30 nvidia-smi topo -m

# 2. The project in a venv (system packages visible: torch for the benchmark), unless
# GPU_CHECK_PYTHON names an interpreter that already has what the runner imports.
py="${GPU_CHECK_PYTHON:-}"
if [ -z "$py" ]; then
  venv="${GPU_CHECK_VENV:-/tmp/gpumarket-gpu-check-venv}"
  step "venv" 120 python3 -m venv --system-site-packages "$venv"
  py="$venv/bin/python"
  [ -x "$py" ] || py="$(command -v python3)"
  if [ -n "${GPU_CHECK_WHEELS:-}" ]; then
    step "pip install wheels (offline)" 180 "$py" -m pip install -q --no-index \
      --find-links "$GPU_CHECK_WHEELS" "$GPU_CHECK_WHEELS"/*.whl
  fi
  # The runner needs no Django: install the project without its server dependencies,
  # then what the runner imports (already there, or fetched when PyPI can be reached).
  step "pip install project (runner)" 180 "$py" -m pip install -q --no-deps \
    --no-build-isolation -e "$repo" ||
    say "(the runner still runs from the checkout: python -m providers.runner)"
  "$py" -c "import httpx, pynvml" >>"$log" 2>&1 ||
    step "pip install runner deps" 180 "$py" -m pip install -q httpx nvidia-ml-py docker \
      websockets
fi
runner=("$py" -m providers.runner)

# 3. The runner on the real GPU and on its fresh recording.
step "inventory (NVML)" 60 "${runner[@]}" inventory
step "inventory --json (NVML)" 60 "${runner[@]}" inventory --json
[ -f "$out/host.q.txt" ] && step "inventory --simulate host.q.txt" 60 \
  "${runner[@]}" inventory --simulate "$out/host.q.txt"
[ -f "$out/host.q.xml" ] && step "inventory --simulate host.q.xml" 60 \
  "${runner[@]}" inventory --simulate "$out/host.q.xml"
step "doctor" 90 "${runner[@]}" doctor
step "benchmark --no-post" 300 "${runner[@]}" benchmark --no-post
step "health reading (NVML)" 60 "$py" -c '
import json, sys
sys.path.insert(0, sys.argv[1])
from providers.runner.nvml import NvmlGpus
gpus = NvmlGpus()
uuids = [g.uuid for g in gpus.inventory().gpus]
print(json.dumps(gpus.sample_health(uuids), indent=2))
' "$repo"

# 4. A MIG layout and back: opt-in, MIG mode already Enabled, no GPU instance yet.
mig_mode="$(timeout 30 nvidia-smi -i 0 --query-gpu=mig.mode.current --format=csv,noheader \
  2>>"$log" | tr -d '[:space:]')"
say "MIG mode of GPU 0: ${mig_mode:-unknown}"
if [ "${GPU_CHECK_MIG_LAYOUT:-0}" != "1" ]; then
  summary+=("SKIP  MIG layout: not asked (GPU_CHECK_MIG_LAYOUT=1); MIG mode ${mig_mode:-?}")
elif [ "$mig_mode" != "Enabled" ]; then
  summary+=("SKIP  MIG layout: MIG mode is ${mig_mode:-unknown}; this script never changes it")
elif timeout 30 nvidia-smi mig -i 0 -lgi 2>>"$log" | grep -q 'MIG'; then
  summary+=("SKIP  MIG layout: GPU 0 already has GPU instances; left as they are")
else
  step "nvidia-smi mig -lgip" 30 nvidia-smi mig -i 0 -lgip
  if step "mig -cgi ${GPU_CHECK_MIG_PROFILES:-1g.18gb,1g.18gb} -C" 60 \
      nvidia-smi mig -i 0 -cgi "${GPU_CHECK_MIG_PROFILES:-1g.18gb,1g.18gb}" -C; then
    record "MIG nvidia-smi -q" "$out/mig.q.txt" 60 nvidia-smi -q -i 0
    record "MIG nvidia-smi -L" "$out/mig.L.txt" 30 nvidia-smi -L
    step "inventory (NVML, MIG)" 60 "${runner[@]}" inventory
    [ -f "$out/mig.q.txt" ] && step "inventory --simulate mig.q.txt" 60 \
      "${runner[@]}" inventory --simulate "$out/mig.q.txt"
  fi
  # Back: remove the compute instances, then the GPU instances this script made.
  step "mig -dci" 60 nvidia-smi mig -i 0 -dci
  step "mig -dgi" 60 nvidia-smi mig -i 0 -dgi
fi
exit 0
