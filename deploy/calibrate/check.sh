#!/usr/bin/env bash
# The whole calibration check on one machine: start vLLM with a small model, calibrate it, run the
# held-apart load on it and on the simulator of the fitted profile (each through a gateway), compare,
# and replay the real gateway's access log on the profile for the SLO attainment (docs/calibrate.md).
#
#   deploy/calibrate/check.sh                         # a GPU if one is found (nvidia-smi / rocm-smi), else CPU
#   deploy/calibrate/check.sh --model Qwen/Qwen2.5-0.5B-Instruct --accelerator h100
#   deploy/calibrate/check.sh --cpu                   # the CPU build and the tiny model `make test-vllm` uses
#
# GPU: `vllm` must be on PATH (the CUDA or ROCm build) and the model reachable (hub or local path).
# CPU: the vLLM CPU virtualenv and the tiny model of `make vllm-model` (built when missing).
# --repeats N: runs of the real server against itself first (default 1; 0: none), which show how
# closely this machine can agree at all. Exit status: 0 when every level agrees within 20 % and the
# replay's attainment within 5 points per class, 1 when not, 2 on a setup error.
# Everything it starts is stopped when it ends; the profile and logs stay in --out (default a temp dir).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
model="" accelerator="" vendor="" port=18700 budget=5m out="" repeats=1
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --accelerator) accelerator=$2; shift 2 ;;
    --cpu) vendor=cpu; shift ;;
    --port) port=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
case "$repeats" in
  ''|*[!0-9]*) echo "--repeats wants a whole number (0: none), not \`$repeats\`" >&2; exit 2 ;;
esac

if [ -z "$vendor" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then vendor=nvidia
  elif command -v rocm-smi >/dev/null 2>&1 && rocm-smi --showproductname >/dev/null 2>&1; then vendor=amd
  else vendor=cpu; fi
fi
out=${out:-$(mktemp -d /tmp/switchyard-calibrate-XXXXXX)}
mkdir -p "$out"
make -s venv
py=.venv/bin/python

# Whether this machine holds one speed at all: a core that changes speed on its own (other guests of a
# virtual machine's host) makes the server a different one from one second to the next, and the check
# then measures the machine; a warning here, not a failure.
echo "== this machine's cores, second by second, with nothing else of the check running"
"$py" -m loadtest.calibrate.core_speed --seconds 20 | tee "$out/core-speed.txt" || true

launch=(--vendor "$vendor" --served-model-name calibrated --port "$port" --max-model-len 2048)
if [ "$vendor" = cpu ]; then
  make -s vllm-model
  cache=${XDG_CACHE_HOME:-$HOME/.cache}/switchyard
  model=${model:-$cache/tiny-llama}
  accelerator=${accelerator:-cpu}
  launch=(--vendor cpu --served-model-name calibrated --port "$port" --max-model-len 512
          --python "$cache/vllm-venv/bin/python")
else
  model=${model:-Qwen/Qwen2.5-0.5B-Instruct}
  accelerator=${accelerator:-$([ "$vendor" = amd ] && echo mi300x || echo h100)}
  launch+=(--accelerator "$accelerator")
fi

echo "== vLLM ($vendor, $accelerator): $model on :$port; logs and profile in $out"
"$py" -m backends.launcher "${launch[@]}" --model "$model" --below-clients --run >"$out/vllm.log" 2>&1 &
server=$!
trap 'kill -TERM "$server" 2>/dev/null; wait "$server" 2>/dev/null || true' EXIT
url=http://127.0.0.1:$port
for _ in $(seq 1 600); do
  if curl -fsS "$url/v1/models" >/dev/null 2>&1; then break; fi
  if ! kill -0 "$server" 2>/dev/null; then echo "vLLM exited:" >&2; tail -30 "$out/vllm.log" >&2; exit 2; fi
  sleep 1
done
curl -fsS "$url/v1/models" >/dev/null || { echo "vLLM not ready in 10 minutes" >&2; exit 2; }

# On the CPU build the engine computes on every core but the first (backends/cpu_priority.py): the
# clients and their gateways keep to that one, or Linux moves them onto the engine's core under load.
apart=()
if [ "$vendor" = cpu ] && command -v taskset >/dev/null 2>&1; then
  first=$("$py" -c 'import os; cpus = sorted(os.sched_getaffinity(0)); print(cpus[0] if len(cpus) > 1 else "")')
  if [ -n "$first" ]; then apart=(taskset -c "$first"); fi
fi

echo "== calibrate (budget $budget), through a gateway as the held-apart load's real leg goes"
"${apart[@]}" .venv/bin/switchyard calibrate --url "$url" --model calibrated --accelerator "$accelerator" \
  --budget "$budget" --out "$out/profile.yaml" --through-gateway

if [ "$repeats" -gt 0 ]; then
  echo "== the real server against itself: the held-apart load twice per level (the floor under the bounds)"
  "${apart[@]}" "$py" -m loadtest.calibrate.repeatability --url "$url" --model calibrated --runs "$repeats" || true
fi

echo "== held-apart load: the real server, then the simulator of the profile"
"${apart[@]}" "$py" -m loadtest.calibrate.check --url "$url" --model calibrated --profile "$out/profile.yaml" --workdir "$out"
