#!/usr/bin/env bash
# The NVML sampler and the GPU pressure reader on a real NVIDIA GPU, end to end.
#
# Needs: an NVIDIA GPU with its driver (libnvidia-ml), python3 with PyTorch
# (CUDA), curl, and vacancyd built with NVML:
#   cargo build --release -p vacancy-cli --features nvml
# Run:   VACANCYD=target/release/vacancyd scripts/gpu-check/run.sh [OUTDIR]
#
# It starts a stand-in upstream server that holds GPU memory and computes
# (gpu_load.py upstream), calibrates the unattended and attended baselines with
# `vacancyd calibrate-pressure`, runs vacancyd with pressure enabled, then
# starts and stops the owner's own GPU work (gpu_load.py owner) and reports
# what vacancyd saw: the NVML sample against nvidia-smi, the attributed owner
# load with the upstream excluded, the refusal while the owner computes, and
# the release after the quiet time. It never fails half-way: every step
# prints what it saw, and the last line says which checks held.
set -u
here=$(cd "$(dirname "$0")" && pwd)
bin=${VACANCYD:-target/release/vacancyd}
out=${1:-$(mktemp -d)}
mkdir -p "$out"
work=$(mktemp -d)
up_port=${UP_PORT:-28080}
proxy_port=$((up_port + 1))
control_port=$((up_port + 2))
control="http://127.0.0.1:$control_port"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
held=(); failed=()
check() { if [ "$2" = yes ]; then held+=("$1"); else failed+=("$1"); fi; echo "check $1: $2"; }

# Start gpu_load.py ROLE ARGS... in the background; wait for its "ready" line.
start_load() {
  local name=$1; shift
  python3 -u "$here/gpu_load.py" "$@" >"$work/$name.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  for _ in $(seq 1 120); do
    grep -q '^ready' "$work/$name.log" && { echo "$name ready (pid $pid)"; echo "$pid"  >"$work/$name.pid"; return 0; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  echo "$name did not start:"; cat "$work/$name.log"; return 1
}
stop_load() { kill "$(cat "$work/$1.pid")" 2>/dev/null; sleep 1; }
pressure() { curl -s "$control/status" | python3 -c 'import json,sys; s=json.load(sys.stdin); print([r for r in s["resources"] if r["name"]=="gpu0"][0]["pressure"])' 2>/dev/null || echo unreachable; }
borrow() {
  curl -s -o "$work/borrow.body" -w '%{http_code}' -X POST "http://127.0.0.1:$proxy_port/v1/chat/completions" \
    -H 'content-type: application/json' -d '{"model":"m","messages":[{"role":"user","content":"hi"}]}'
}

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,memory.free,utilization.gpu --format=csv
"$bin" --version

cat >"$work/vacancyd.toml" <<CONF
[server]
listen = "127.0.0.1:$control_port"
admission_state_dir = "$work/state"

[owner]
presence = "none"

[owner.gpu_pressure]
enabled = true
poll_ms = 500
engage_ms = 1000
quiet_ms = 3000

[[resource]]
name = "gpu0"
kind = "gpu"
sampler = "nvml"
device = "0"
reserve_mib = 1024
poll_ms = 500

[[upstream]]
name = "chat"
adapter = "openai"
listen = "127.0.0.1:$proxy_port"
target = "http://127.0.0.1:$up_port"
resource = "gpu0"
default_min_free_mib = 2048
on_owner_return = "drain"
drain_timeout_s = 30
CONF
cp "$work/vacancyd.toml" "$out/vacancyd.toml"
mkdir -m 700 "$work/state"
echo "== check-config"
"$bin" check-config --config "$work/vacancyd.toml"

echo "== the upstream: a server that never touches the GPU and a runner it started: 3072 MiB held, busy 30% of the time"
start_load upstream upstream --port "$up_port" --mib 3072 --duty 0.3 --runner || exit 1
grep '^runner' "$work/upstream.log"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv

echo "== calibrate-pressure --unattended (only the upstream on the GPU: it must be excluded)"
"$bin" calibrate-pressure --config "$work/vacancyd.toml" --resource gpu0 --unattended --seconds 5 | tee "$work/unattended.txt"
grep -q 'excluding 2 upstream processes' "$work/unattended.txt" && ok=yes || ok=no
check "the upstream's PID is found through its listening socket, its runner as its child" $ok
grep -q ' 0% / 0 MiB (excluding' "$work/unattended.txt" && ! grep -v ' 0% / 0 MiB (excluding' "$work/unattended.txt" | grep -q '^ *[0-9]*: ' && ok=yes || ok=no
check "the runner's memory and compute are not the owner's" $ok
mem=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d)' "$work/state/pressure-calibration.json" 2>&1)
echo "calibration file: $mem"

echo "== the owner: 6144 MiB held, busy 60% of the time"
start_load owner owner --mib 6144 --duty 0.6 || exit 1
nvidia-smi --query-compute-apps=pid,used_memory --format=csv
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv
echo "== calibrate-pressure --attended (the owner computing)"
"$bin" calibrate-pressure --config "$work/vacancyd.toml" --resource gpu0 --attended --seconds 5 | tee "$work/attended.txt"
cp "$work/state/pressure-calibration.json" "$out/" 2>/dev/null
cat "$work/state/pressure-calibration.json"; echo
stop_load owner

echo "== vacancyd run, pressure enabled, the owner away"
VACANCYD_LOG=info "$bin" run --config "$work/vacancyd.toml" >"$out/vacancyd.log" 2>&1 &
pids+=("$!")
for _ in $(seq 1 40); do curl -sf "$control/health" >/dev/null && break; sleep 0.25; done
sleep 2
curl -s "$control/status" | python3 -m json.tool | tee "$out/status-quiet.json" | sed -n '/"resources"/,/]/p'
nvidia-smi --query-gpu=memory.total,memory.free --format=csv
p=$(pressure); echo "pressure: $p"
[ "$p" = admits ] && ok=yes || ok=no; check "quiet: the upstream's own load does not count as the owner's" $ok
code=$(borrow); echo "borrower: $code $(head -c 300 "$work/borrow.body")"
[ "$code" = 200 ] && ok=yes || ok=no; check "quiet: a borrower is served" $ok

echo "== a slow borrowed generation (10 s) runs; then the owner starts computing again"
curl -s --max-time 60 -o "$work/slow.body" -w '%{http_code}' -X POST "http://127.0.0.1:$proxy_port/v1/chat/completions" \
  -H 'content-type: application/json' -d '{"model":"slow","messages":[{"role":"user","content":"hi"}]}' >"$work/slow.code" &
slow=$!
sleep 0.5
start_load owner owner --mib 6144 --duty 0.6 || exit 1
t0=$(date +%s%N); p=admits
for _ in $(seq 1 40); do p=$(pressure); [ "$p" != admits ] && [ "$p" != unreachable ] && break; sleep 0.1; done
echo "first refusal after $(( ($(date +%s%N) - t0) / 1000000 )) ms: $p"
[ "$p" != admits ] && [ "$p" != unreachable ] && ok=yes || ok=no; check "the owner's load refuses new work at once" $ok
code=$(borrow); echo "borrower: $code $(head -c 400 "$work/borrow.body")"
[ "$code" = 503 ] && ok=yes || ok=no; check "a borrower is refused with 503 while the owner computes" $ok
for _ in $(seq 1 60); do p=$(pressure); case "$p" in "GPU pressure engaged"*) break;; esac; sleep 0.1; done
echo "engaged after $(( ($(date +%s%N) - t0) / 1000000 )) ms: $p"
case "$p" in "GPU pressure engaged"*) ok=yes;; *) ok=no;; esac; check "pressure engages after engage_ms" $ok
curl -s "$control/status" | python3 -m json.tool >"$out/status-engaged.json"
n=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["reclaims"]; print("reclaims:", r, file=sys.stderr); print(len(r))' "$out/status-engaged.json")
[ "$n" -ge 1 ] && ok=yes || ok=no; check "engaged pressure starts a reclaim of the work on the GPU" $ok
"$bin" status --url "$control" 2>&1 | tee "$out/status-engaged.txt" || true
wait "$slow"
echo "the slow generation: $(cat "$work/slow.code") $(head -c 200 "$work/slow.body")"
[ "$(cat "$work/slow.code")" = 200 ] && ok=yes || ok=no; check "accepted work drains: it finishes within drain_timeout_s" $ok
sleep 1

echo "== the owner stops"
stop_load owner
t0=$(date +%s%N)
for _ in $(seq 1 100); do p=$(pressure); [ "$p" = admits ] && break; sleep 0.1; done
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
echo "admits after $ms ms (quiet_ms = 3000, plus the 1 s wait after the kill): $p"
[ "$p" = admits ] && [ "$ms" -ge 1500 ] && ok=yes || ok=no; check "pressure releases after the quiet time, not before" $ok
sleep 1
code=$(borrow); echo "borrower: $code"
[ "$code" = 200 ] && ok=yes || ok=no; check "a borrower is served again" $ok
curl -s "$control/metrics" | grep -i 'pressure\|refus\|reclaim' | head -20
grep -i 'pressure\|reclaim' "$out/vacancyd.log" | sed 's/\x1b\[[0-9;]*m//g' | head -30

echo "== checks held: ${#held[@]}, failed: ${#failed[@]} ${failed[*]:-}"
