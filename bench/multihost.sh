#!/usr/bin/env bash
# Downpour against PyTorch DDP across hosts, emulated on one GPU machine:
# each "host" is a network namespace joined to one bridge by a veth pair
# whose two ends are limited with `tc ... tbf` to RATE, so every byte a host
# sends or receives crosses a link of that speed (MTU 9000 on every link).
#
#   w0, w1   worker hosts, GPUS_PER_HOST GPUs each (w0 the first ones, w1
#            the next; with too few GPUs they are reused, and the run says
#            so): a Downpour worker with --devices of its GPUs, or a DDP
#            node of torch.distributed.run with one process per GPU
#   s0, s1   CPU-only shard hosts (LAYOUT cpu_shards, BytePS's layout); with
#            LAYOUT colocated the shards run on w0 and w1 instead
#   the coordinator stays in this namespace, on the bridge (control only)
#
# For each RATE of RATES and each system of SYSTEMS (downpour; downpour_int8:
# the same with gradients and parameters as int8, JobSpec's wire dtypes;
# ddp: fp32 all-reduce; ddp_bf16: DDP with bf16_compress_hook), one run of MODEL
# (resnet18, vgg11, cnn) in PRECISION for EPOCHS epochs of Fashion-MNIST, 128
# examples a GPU a step. Printed per run, as a JSON line in $OUT/multihost.jsonl
# and a table in $OUT/multihost.md: examples/s (every GPU together, both
# systems over the same steady windows: the epochs after the first, between
# evaluations; Downpour's from its workers' step counters sampled every
# 0.2 s, PyTorch's from pytorch_train.py's own clock; Downpour's rate over
# its workers' whole training time, start-up and evaluations included, is
# kept beside it as examples_per_s_whole_run), the final test accuracy and
# time to TARGET where reached (from the submit or launch: start-up counts),
# and the bytes each host's link carried a step in each direction (its
# veth's counters over the whole run over the steps), beside
# the theoretical figure, the packets the links' queues dropped, and
# (Downpour) the daemons' own figures a step from their /metrics: each
# shard's bytes and apply time, each worker's bytes, messages and their
# mean round trip. The theoretical figure: Downpour a worker host pushes gradients
# (gradient_wire_dtype) and pulls parameters (bf16 weights of a bf16 job,
# fp32 otherwise) once a step; a ring all-reduce moves 2 (n-1)/n of the
# gradient in and out of each of the n hosts.
#
# Needs root, `ip` and `tc` (iproute2; on a host without them, bring them
# with scripts/pack-binaries.sh and put the folder's bin on PATH), Python
# with PyTorch for the DDP runs, and the programs (bench/lib.sh: DOWNPOUR_BIN
# or bazel-bin): //coordinator:downpour-coordinator //server:downpour-ps
# //worker:downpour-worker //client:downpourctl.
#
# Environment (defaults in brackets): RATES [25gbit 10gbit], SYSTEMS
# [downpour ddp ddp_bf16], LAYOUT [cpu_shards], MODEL [resnet18], PRECISION
# [bf16], GPUS_PER_HOST [2], EPOCHS [3], TARGET [0.92 resnet18 and vgg11, 0.90 cnn],
# EXTRA_SPEC [scaling_tools.py's --extra, e.g. "gradient_wire_dtype:
# BFLOAT16"], WORKER_FLAGS, PS_FLAGS, DEVICES [gpu; cpu: no --devices, DDP
# on gloo], PYTHON [python3], RUN_TIMEOUT [900 s], OUT [./multihost-out],
# FASHION_MNIST_DIR.
#   RATES="25gbit 10gbit" bash bench/multihost.sh
#   LAYOUT=colocated SYSTEMS=downpour bash bench/multihost.sh
set -uo pipefail
OUT=${OUT:-$PWD/multihost-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BENCH=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=bench/lib.sh
source "$BENCH/lib.sh" || exit 2
RATES=${RATES:-25gbit 10gbit}
SYSTEMS=${SYSTEMS:-downpour ddp ddp_bf16}
LAYOUT=${LAYOUT:-cpu_shards}
MODEL=${MODEL:-resnet18}
PRECISION=${PRECISION:-bf16}
G=${GPUS_PER_HOST:-2}
EPOCHS=${EPOCHS:-3}
EXTRA_SPEC=${EXTRA_SPEC:-}
WORKER_FLAGS=${WORKER_FLAGS:-}
PS_FLAGS=${PS_FLAGS:-}
DEVICES=${DEVICES:-gpu}
PYTHON=${PYTHON:-python3}
RUN_TIMEOUT=${RUN_TIMEOUT:-900}
case $MODEL in
  # The model's float32 bytes (Fashion-MNIST: one channel in, ten classes).
  resnet18) TARGET=${TARGET:-0.92} PARAM_BYTES=44691240 ;;
  vgg11) TARGET=${TARGET:-0.92} PARAM_BYTES=112582440 ;;
  cnn) TARGET=${TARGET:-0.90} PARAM_BYTES=1610000 ;;
  *) echo "multihost: MODEL=$MODEL: resnet18, vgg11 or cnn" >&2; exit 2 ;;
esac
case $LAYOUT in cpu_shards | colocated) ;; *) echo "multihost: LAYOUT=$LAYOUT: cpu_shards or colocated" >&2; exit 2 ;; esac
((EUID == 0)) || { echo "multihost: needs root (network namespaces, tc)" >&2; exit 2; }
for tool in ip tc; do
  command -v $tool >/dev/null || { echo "multihost: no '$tool' (iproute2) on PATH" >&2; exit 2; }
done
downpour_need COORDINATOR coordinator/downpour-coordinator
downpour_need PS server/downpour-ps
downpour_need WORKER worker/downpour-worker
downpour_need CTL client/downpourctl

BRIDGE=dpmh0
NET=10.79.0
HOSTS=(w0 w1 s0 s1)
declare -A ADDR=([w0]=$NET.10 [w1]=$NET.11 [s0]=$NET.12 [s1]=$NET.13)
declare -A LINK=([w0]=dpmhw0 [w1]=dpmhw1 [s0]=dpmhs0 [s1]=dpmhs1)
WORK=$(mktemp -d -t downpour-multihost.XXXXXX)
PIDS=()

note() { echo "multihost: $*" | tee -a "$OUT/notes.txt" >&2; }

net_down() {
  for h in "${HOSTS[@]}"; do ip netns del "dpmh-$h" 2>/dev/null; done
  ip link del "$BRIDGE" 2>/dev/null
  return 0
}

# net_up RATE: the bridge, a namespace per host, each link limited to RATE
# both ways (the host side's egress is what the host receives).
net_up() {
  local rate=$1 bits burst h number=${1%bit}
  bits=$(numfmt --from=si "${number^^}") || return 1
  # A burst of 4 ms at the rate (at least 1 MiB): tbf needs one at least
  # rate / HZ at these speeds.
  burst=$((bits / 8 / 250))
  ((burst < 1048576)) && burst=1048576
  net_down
  ip link add "$BRIDGE" type bridge && ip addr add "$NET.1/24" dev "$BRIDGE" &&
    ip link set "$BRIDGE" mtu 9000 up || return 1
  for h in "${HOSTS[@]}"; do
    ip netns add "dpmh-$h" &&
      ip link add "${LINK[$h]}" type veth peer name "${LINK[$h]}n" &&
      ip link set "${LINK[$h]}n" netns "dpmh-$h" &&
      ip -n "dpmh-$h" addr add "${ADDR[$h]}/24" dev "${LINK[$h]}n" &&
      ip -n "dpmh-$h" link set "${LINK[$h]}n" mtu 9000 up &&
      ip -n "dpmh-$h" link set lo up &&
      ip link set "${LINK[$h]}" master "$BRIDGE" &&
      ip link set "${LINK[$h]}" mtu 9000 up &&
      tc qdisc replace dev "${LINK[$h]}" root tbf rate "$rate" burst "$burst" latency 50ms &&
      tc -n "dpmh-$h" qdisc replace dev "${LINK[$h]}n" root tbf rate "$rate" burst "$burst" \
        latency 50ms || return 1
  done
}

# stop_all PID...: in reverse start order (workers, then shards, then the
# coordinator: a shard still hosting a job waits for the coordinator's
# release), each given 10 s before SIGKILL.
stop_all() {
  local i pid t
  for ((i = $# ; i >= 1; i--)); do
    pid=${!i}
    kill "$pid" 2>/dev/null || continue
    for t in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
}
cleanup() {
  stop_all "${PIDS[@]}"
  net_down
  rm -rf "$WORK" "$OUT/line.json"
}
trap cleanup EXIT

# link_bytes: "host rx tx" lines, each host's link counters as the host sees
# them (rx: what reached it; the bridge side's tx).
link_bytes() {
  local h
  for h in "${HOSTS[@]}"; do
    echo "$h $(cat "/sys/class/net/${LINK[$h]}/statistics/tx_bytes")" \
      "$(cat "/sys/class/net/${LINK[$h]}/statistics/rx_bytes")"
  done
}

# link_drops: "host dropped" lines, packets each host's link queues dropped
# both ways so far (tbf's queue full: TCP then retransmits, and those bytes
# count in link_bytes too).
link_drops() {
  local h
  for h in "${HOSTS[@]}"; do
    echo "$h $(( $(tc -s qdisc show dev "${LINK[$h]}" | sed -n 's/.*dropped \([0-9]*\).*/\1/p' | head -1) +
      $(tc -n "dpmh-$h" -s qdisc show dev "${LINK[$h]}n" | sed -n 's/.*dropped \([0-9]*\).*/\1/p' | head -1) ))"
  done
}

# gpus_of HOST_INDEX: the comma list of that worker host's GPUs.
GPU_COUNT=0
[[ $DEVICES != cpu ]] && GPU_COUNT=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
gpus_of() {
  local i list="" g
  for ((i = $1 * G; i < ($1 + 1) * G; i++)); do
    g=$i
    ((GPU_COUNT > 0)) && g=$((i % GPU_COUNT))
    list="$list${list:+,}$g"
  done
  echo "$list"
}
if [[ $DEVICES != cpu ]] && ((GPU_COUNT < 2 * G)); then
  note "$GPU_COUNT GPU(s) for 2 hosts x $G: GPUs are shared between the emulated hosts"
fi

wait_file() {
  local i
  for i in $(seq 300); do [[ -s $1 ]] && return 0; sleep 0.1; done
  return 1
}

DATA=$WORK/data
"$CTL" dataset import --fashion_mnist="$FASHION_MNIST_DIR" --out_dir="$DATA/fashion-mnist" \
  --shards=8 >"$OUT/import.log" 2>&1 || { note "dataset import failed: $OUT/import.log"; exit 1; }
BATCH=$((128 * G))
EPOCH=$(((60000 + BATCH * 2 - 1) / (BATCH * 2)))
STEPS=$((EPOCHS * EPOCH))

# run_downpour RATE NAME: one Downpour run; prints its JSON line.
run_downpour() {
  local rate=$1 name=$2 R=$OUT/runs/$2 C h i shard_hosts before after t0 t1 run_pids=()
  # A run of the same name before: none of its files (samples, scrapes) count.
  rm -rf "$R"
  mkdir -p "$R"
  shard_hosts=(s0 s1)
  [[ $LAYOUT == colocated ]] && shard_hosts=(w0 w1)
  local base=$DOWNPOUR_ROOT/examples/fashion_mnist_$MODEL.pbtxt
  python3 "$BENCH/scaling_tools.py" spec --base "$base" --out "$R/spec.pbtxt" \
    --name "multihost-$name" --workers 2 --shards 2 --mode SYNC --precision "$PRECISION" \
    --batch "$BATCH" --steps "$STEPS" --eval_every "$EPOCH" --target 0.999 \
    --extra "$EXTRA_SPEC" || return 1
  "$COORDINATOR" --listen="$NET.1:0" --port_file="$R/c.port" --state_dir="$R/state" \
    --insecure >"$R/coordinator.log" 2>&1 &
  run_pids+=($!)
  PIDS+=($!)
  wait_file "$R/c.port" || { note "$name: the coordinator did not start"; stop_all "${run_pids[@]}"; return 1; }
  C=$(cat "$R/c.port")
  for i in 0 1; do
    h=${shard_hosts[$i]}
    # shellcheck disable=SC2086  # PS_FLAGS: words
    # --shared_memory=false on both sides: the emulated hosts share one
    # kernel, and real ones could not map each other's memory.
    ip netns exec "dpmh-$h" "$PS" --listen="${ADDR[$h]}:0" --port_file="$R/ps$i.port" \
      --coordinator="$C" --node_id="ps$i" --insecure --shared_memory=false \
      --metrics_listen="${ADDR[$h]}:0" $PS_FLAGS \
      >"$R/ps$i.log" 2>&1 &
    run_pids+=($!)
    PIDS+=($!)
  done
  for i in 0 1; do
    h=w$i
    local devs=()
    [[ $DEVICES != cpu ]] && devs=("--devices=$(gpus_of $i)")
    # shellcheck disable=SC2086  # WORKER_FLAGS: words
    ip netns exec "dpmh-$h" "$WORKER" --listen="${ADDR[$h]}:0" --port_file="$R/w$i.port" \
      --coordinator="$C" --node_id="w$i" --data_dir="$DATA" --insecure --shared_memory=false \
      --metrics_listen="${ADDR[$h]}:0" \
      "${devs[@]}" $WORKER_FLAGS >"$R/worker$i.log" 2>&1 &
    run_pids+=($!)
    PIDS+=($!)
  done
  for i in 0 1; do
    wait_file "$R/ps$i.port" && wait_file "$R/w$i.port" ||
      { note "$name: a daemon did not start (logs in $R)"; stop_all "${run_pids[@]}"; return 1; }
  done
  # The workers' step counters and step-time sums every 0.2 s: the rate
  # over the steady windows, measured as pytorch_train.py measures DDP's
  # (epochs after the first, between evaluations).
  local metrics="" sampler
  for i in $(seq 200); do
    metrics=$("$CTL" --coordinator="$C" -o json nodes 2>/dev/null |
      python3 "$BENCH/scaling_tools.py" nodes --workers 2 --shards 2) && break
    metrics=""
    sleep 0.1
  done
  if [[ -z $metrics ]]; then
    note "$name: the daemons did not register (logs in $R)"
    stop_all "${run_pids[@]}"
    return 1
  fi
  # shellcheck disable=SC2086  # metrics: words
  python3 "$BENCH/scaling_tools.py" sample --out "$R/samples.jsonl" --interval 0.2 $metrics &
  sampler=$!
  PIDS+=("$sampler")
  link_bytes >"$R/links.before"
  link_drops >"$R/drops.before"
  # Every daemon's /metrics once a second while the job runs, the last
  # scrape holding the job's series kept (a shard drops them when the job
  # ends): where a step's time went on each side.
  python3 - "$R" "$CTL" "$C" <<'EOF_SCRAPE' &
import json, os, subprocess, sys, time, urllib.request
R, ctl, coordinator = sys.argv[1:4]
while not os.path.exists(f"{R}/scrape.stop"):
    try:
        nodes = json.loads(subprocess.run([ctl, f"--coordinator={coordinator}", "-o", "json", "nodes"],
                                          capture_output=True, text=True, timeout=10).stdout)
    except (ValueError, subprocess.SubprocessError):
        nodes = []
    for n in nodes:
        try:
            text = urllib.request.urlopen(f"http://{n['metrics_address']}/metrics", timeout=2).read().decode()
        except (KeyError, OSError):
            continue
        if 'job="run"' in text:
            open(f"{R}/metrics-{n['id']}.txt", "w").write(text)
    time.sleep(1)
EOF_SCRAPE
  local scraper=$!
  PIDS+=("$scraper")
  t0=$(date +%s.%N)
  timeout "$RUN_TIMEOUT" "$CTL" --coordinator="$C" submit "$R/spec.pbtxt" --job_id=run --wait \
    >"$R/submit.out" 2>"$R/submit.err"
  local rc=$?
  t1=$(date +%s.%N)
  link_bytes >"$R/links.after"
  link_drops >"$R/drops.after"
  "$CTL" --coordinator="$C" -o json get run >"$R/job.json" 2>>"$R/submit.err"
  touch "$R/scrape.stop"
  wait "$scraper"
  stop_all "$sampler"
  stop_all "${run_pids[@]}"
  python3 "$BENCH/scaling_tools.py" result --job "$R/job.json" --samples "$R/samples.jsonl" \
    --shape "2 workers x $G GPU, 2 shards" --model "$MODEL" --mode SYNC --precision "$PRECISION" \
    --workers 2 --gpus $((2 * G)) --shards 2 --batch "$BATCH" --t_submit "$t0" --t_end "$t1" \
    --target "$TARGET" --extra "$EXTRA_SPEC" >"$R/steady.json" 2>>"$R/submit.err" ||
    note "$name: no steady rate (bench/scaling_tools.py result failed; see $R/submit.err)"
  python3 - "$R" "$name" "$rate" "$rc" "$t0" "$t1" <<'EOF'
import json, re, sys
R, name, rate, rc, t0, t1 = sys.argv[1:7]
import os
env = os.environ
def links(path):
    return {h: (int(rx), int(tx)) for h, rx, tx in (l.split() for l in open(path))}
def drops(path):
    try:
        return {h: int(n) for h, n in (l.split() for l in open(path))}
    except (OSError, ValueError):
        return {}
before, after = links(f"{R}/links.before"), links(f"{R}/links.after")
dropped = {h: n - drops(f"{R}/drops.before").get(h, 0) for h, n in drops(f"{R}/drops.after").items()}
try:
    steady = json.load(open(f"{R}/steady.json"))
except (OSError, ValueError):
    steady = {}
rate_sum, steps = 0.0, 0
for i in (0, 1):
    text = open(f"{R}/worker{i}.log").read()
    m = re.findall(r"trained (\d+) steps in ([\d.]+) s", text)
    split = re.findall(r"per step ([\d.]+) ms: input ([\d.]+), compute ([\d.]+), exchange ([\d.]+)", text)
    if m:
        n, s = int(m[-1][0]), float(m[-1][1])
        rate_sum += n * int(env["BATCH"]) / s
        steps = max(steps, n)
out = open(f"{R}/submit.out").read()
acc = re.search(r"test_accuracy=([\d.]+)", out)
# Time to target: the first evaluation at or above it, from the clock taken
# just before the submit (one host, one clock).
try:
    evaluations = json.load(open(f"{R}/job.json")).get("evaluations", [])
except (OSError, ValueError):
    evaluations = []
reached = next((e for e in evaluations if float(e.get("accuracy", 0)) >= float(env["TARGET"])), None)
ttt = round(int(reached["time_ms"]) / 1000.0 - float(t0), 1) if reached else None
line = {"system": env.get("SYSTEM", "downpour"), "layout": env["LAYOUT"], "rate": rate,
        "model": env["MODEL"],
        "precision": env["PRECISION"], "extra": env.get("EXTRA_SPEC", ""),
        "gpus": 0 if env["DEVICES"] == "cpu" else 2 * int(env["G"]),
        "examples_per_s": steady.get("examples_per_s"),
        "rate_method": steady.get("rate_method"),
        "steady_split": {k: steady.get(f"{k}_frac") for k in ("input_wait", "compute", "exchange")},
        "examples_per_s_whole_run": round(rate_sum, 1),
        "test_accuracy": float(acc.group(1)) if acc else None, "time_to_target_s": ttt,
        "rc": int(rc),
        "wall_s": round(float(t1) - float(t0), 1), "steps": steps,
        "split_ms": [float(x) for x in split[-1]] if split else None}
per_step = {}
for h in before:
    rx = (after[h][0] - before[h][0]) / max(steps, 1)
    tx = (after[h][1] - before[h][1]) / max(steps, 1)
    per_step[h] = {"rx_mb": round(rx / 1e6, 2), "tx_mb": round(tx / 1e6, 2)}
line["link_mb_per_step"] = per_step
line["link_drops"] = dropped
# The daemons' own counts per step: a shard's bytes and apply seconds, a
# worker's bytes and message round trips (the SYNC wait for the other
# worker included).
def series(path):
    values = {}
    try:
        for l in open(path):
            if l.startswith("#") or not l.strip():
                continue
            name_labels, _, value = l.rpartition(" ")
            name = name_labels.split("{")[0]
            if 'job="run"' in name_labels or "{" not in name_labels:
                values[name] = values.get(name, 0.0) + float(value)
    except (OSError, ValueError):
        pass
    return values
import glob
daemons = {}
for path in sorted(glob.glob(f"{R}/metrics-*.txt")):
    node, v, n = path.rsplit("metrics-", 1)[1][:-4], series(path), max(steps, 1)
    if node.startswith("ps"):
        daemons[node] = {
            "in_mb": round(v.get("downpour_ps_received_bytes_total", 0) / n / 1e6, 2),
            "out_mb": round(v.get("downpour_ps_sent_bytes_total", 0) / n / 1e6, 2),
            "apply_ms": round(v.get("downpour_ps_apply_seconds_sum", 0) / n * 1e3, 2),
            "applies": round(v.get("downpour_ps_apply_seconds_count", 0) / n, 1)}
    else:
        calls = v.get("downpour_worker_push_seconds_count", 0)
        daemons[node] = {
            "pushed_mb": round(v.get("downpour_worker_pushed_bytes_total", 0) / n / 1e6, 2),
            "pulled_mb": round(v.get("downpour_worker_pulled_bytes_total", 0) / n / 1e6, 2),
            "messages": round(calls / n, 1),
            "round_trip_ms": round(v.get("downpour_worker_push_seconds_sum", 0) / calls * 1e3, 2)
            if calls else None,
            # The run's total (a job's first step retries while it reaches the shards).
            "retries_in_all": v.get("downpour_worker_rpc_retries_total", 0)}
line["daemons_per_step"] = daemons
print(json.dumps(line))
EOF
}

# run_ddp RATE NAME HOOK: one DDP run over the two worker hosts.
run_ddp() {
  local rate=$1 name=$2 hook=$3 R=$OUT/runs/$2 r pids=() before t0
  mkdir -p "$R"
  link_bytes >"$R/links.before"
  link_drops >"$R/drops.before"
  t0=$(date +%s.%N)
  for r in 0 1; do
    local env=(NCCL_SOCKET_IFNAME="${LINK[w$r]}n" NCCL_HOSTID="downpour-multihost-w$r"
      NCCL_IB_DISABLE=1 NCCL_NVLS_ENABLE=0 GLOO_SOCKET_IFNAME="${LINK[w$r]}n"
      PYTHONUNBUFFERED=1)
    [[ $DEVICES != cpu ]] && env+=(CUDA_VISIBLE_DEVICES="$(gpus_of $r)")
    local args=(--model "$MODEL" --precision "$PRECISION" --epochs "$EPOCHS"
      --target "$TARGET" --comm_hook "$hook" --fashion "$FASHION_MNIST_DIR" --t0 "$t0")
    [[ $DEVICES == cpu ]] && args+=(--device cpu)
    ip netns exec "dpmh-w$r" env "${env[@]}" timeout "$RUN_TIMEOUT" "$PYTHON" \
      -m torch.distributed.run --nnodes=2 --node_rank=$r --nproc_per_node="$G" \
      --master_addr="${ADDR[w0]}" --master_port=29511 "$BENCH/pytorch_train.py" "${args[@]}" \
      >"$R/node$r.log" 2>&1 &
    pids+=($!)
    PIDS+=($!)
  done
  local rc=0
  for r in 0 1; do wait "${pids[$r]}" || rc=$?; done
  link_bytes >"$R/links.after"
  link_drops >"$R/drops.after"
  python3 - "$R" "$name" "$rate" "$rc" "$hook" <<'EOF'
import json, sys, os
R, name, rate, rc, hook = sys.argv[1:6]
env = os.environ
def links(path):
    return {h: (int(rx), int(tx)) for h, rx, tx in (l.split() for l in open(path))}
def drops(path):
    try:
        return {h: int(n) for h, n in (l.split() for l in open(path))}
    except (OSError, ValueError):
        return {}
before, after = links(f"{R}/links.before"), links(f"{R}/links.after")
dropped = {h: n - drops(f"{R}/drops.before").get(h, 0) for h, n in drops(f"{R}/drops.after").items()}
result = {}
for l in open(f"{R}/node0.log"):
    if l.startswith("{") and '"system"' in l:
        result = json.loads(l)
steps = max(int(result.get("steps") or 0), 1)
line = {"system": "ddp" if hook == "none" else "ddp_bf16", "layout": "-", "rate": rate,
        "model": env["MODEL"], "precision": env["PRECISION"],
        "gpus": 0 if env["DEVICES"] == "cpu" else 2 * int(env["G"]),
        "examples_per_s": result.get("examples_per_s"),
        "test_accuracy": result.get("test_accuracy"),
        "time_to_target_s": result.get("time_to_target_s"), "rc": int(rc), "steps": steps,
        "link_mb_per_step": {h: {"rx_mb": round((after[h][0] - before[h][0]) / steps / 1e6, 2),
                                 "tx_mb": round((after[h][1] - before[h][1]) / steps / 1e6, 2)}
                             for h in before},
        "link_drops": dropped}
print(json.dumps(line))
EOF
}

# record CMD...: runs CMD in this shell, not a pipeline's subshell, so the
# PIDs it adds reach cleanup while it runs (an interrupted run leaves no
# daemon behind; once it returns they are its own to have stopped, and
# their numbers may be reused), and appends the JSON line it prints to
# multihost.jsonl, showing it too.
record() {
  local before=${#PIDS[@]}
  "$@" >"$OUT/line.json"
  PIDS=("${PIDS[@]:0:before}")
  cat "$OUT/line.json"
  cat "$OUT/line.json" >>"$OUT/multihost.jsonl"
  rm -f "$OUT/line.json"
}

export BATCH LAYOUT MODEL PRECISION G EXTRA_SPEC DEVICES TARGET
: >"$OUT/multihost.jsonl"
for rate in $RATES; do
  net_up "$rate" || { note "could not build the links at $rate (ip/tc failed)"; exit 1; }
  for system in $SYSTEMS; do
    name="$MODEL-$PRECISION-$rate-$system"
    case $system in
      downpour) name="$name-$LAYOUT"; record run_downpour "$rate" "$name" ;;
      downpour_int8)
        # Gradients and parameters as int8 with error feedback (the
        # EXTRA_SPEC's wire dtypes replaced).
        name="$name-$LAYOUT"
        EXTRA_SPEC="$(sed -E 's/(gradient|parameter)_wire_dtype: *[A-Z0-9]+//g' <<<"$EXTRA_SPEC") gradient_wire_dtype: INT8 parameter_wire_dtype: INT8" \
          SYSTEM=downpour_int8 record run_downpour "$rate" "$name" ;;
      ddp) record run_ddp "$rate" "$name" none ;;
      ddp_bf16) record run_ddp "$rate" "$name" bf16 ;;
      *) note "SYSTEMS: $system is not downpour, downpour_int8, ddp or ddp_bf16" ;;
    esac
  done
done
# Theoretical bytes a worker host's link carries a step, each way.
python3 - "$OUT/multihost.jsonl" "$PARAM_BYTES" >"$OUT/multihost.md" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
param = int(sys.argv[2])
print("| system | layout | link | examples/s | time to target s | test accuracy | w0 link MB/step in / out | s0 link MB/step in / out | theory MB/step per worker host, each way |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    links = r.get("link_mb_per_step", {})
    w0, s0 = links.get("w0", {}), links.get("s0", {})
    if r["system"].startswith("downpour"):
        extra = r.get("extra", "")
        # INT8: a byte an element and a float32 scale a block of 256.
        int8 = lambda dtype: f"{dtype}_wire_dtype: INT8" in extra
        grad = param // 2 if "BFLOAT16" in extra or "FLOAT16" in extra else param
        grad = param * 260 // 1024 if int8("gradient") else grad
        # A bf16/fp16 job on GPUs pulls its weights (most of the bytes) narrowed.
        narrowed = r["precision"] in ("bf16", "fp16") and r.get("gpus", 0) > 0
        pull = param // 2 if narrowed else param
        pull = param * 260 // 1024 if int8("parameter") else pull
        theory = f"out {grad / 1e6:.1f} (gradients), in ~{pull / 1e6:.1f} (parameters)"
    else:
        per = param // 2 if r["system"] == "ddp_bf16" else param
        theory = f"{2 * (2 - 1) / 2 * per / 1e6:.1f} each way (ring over 2 hosts)"
    # A Downpour run too short for a steady window falls back to its
    # whole run: not comparable with DDP's steady epochs, so it says so.
    rate = r.get("examples_per_s")
    if r.get("rate_method", "steady windows") != "steady windows":
        rate = f"{rate} ({r.get('rate_method')})"
    print(f"| {r['system']} | {r['layout']} | {r['rate']} | {rate} | "
          f"{r.get('time_to_target_s')} | "
          f"{r.get('test_accuracy')} | {w0.get('rx_mb')} / {w0.get('tx_mb')} | "
          f"{s0.get('rx_mb')} / {s0.get('tx_mb')} | {theory} |")
EOF
cat "$OUT/multihost.md"
