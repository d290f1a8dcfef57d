# Shared setup of the network-namespace tests (sourced, not run): Linux
# network namespaces on one bridge, each with a veth of its own and the
# address NET.(i+1), so that the controller and each agent run on a "host"
# of their own; mutual TLS between them (`endure certs`); the job spec, the
# single-machine reference run and the checks on report.json.
#
# The sourcing script sets `endure` and `train` (the binaries) and calls
# netns_setup NAME... (first the controller's host, then the agents'); it
# exits 77 (ctest: skipped) with a message where namespaces cannot be made.
# Everything started with netns_start goes at exit, with the namespaces,
# the bridge and (unless KEEP is set) the scratch directory $work.

skip() {
  echo "SKIP: $*"
  exit 77
}

tag=$$
net=10.213.$((tag % 250))
work=""
ns=()
pids=()
bridge="enb$tag"

netns_cleanup() {
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for n in "${ns[@]}"; do
    # Whatever still runs in the namespace (workers) goes with it.
    for pid in $(ip netns pids "$n" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$n" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
  if [ -n "$work" ] && [ -z "${KEEP:-}" ]; then rm -rf "$work"; fi
}

# netns_setup NAME...: namespace i holds veth p$tag$i at $net.(i+1), its
# peer v$tag$i on the bridge (`netns_link i down|up` cuts and restores it).
netns_setup() {
  [ "$(id -u)" = 0 ] || skip "needs root to create network namespaces"
  command -v ip >/dev/null || skip "needs iproute2 (ip)"
  work=$(mktemp -d /tmp/endure_netns.XXXXXX)
  trap netns_cleanup EXIT
  local i=0
  for name in "$@"; do ns+=("endure-$name-$tag"); done
  ip netns add "${ns[0]}" 2>/dev/null || skip "cannot create a network namespace here"
  for ((i = 1; i < ${#ns[@]}; i++)); do ip netns add "${ns[$i]}"; done
  ip link add "$bridge" type bridge
  ip link set "$bridge" up
  for ((i = 0; i < ${#ns[@]}; i++)); do
    ip link add "v$tag$i" type veth peer name "p$tag$i"
    ip link set "p$tag$i" netns "${ns[$i]}"
    ip link set "v$tag$i" master "$bridge" up
    ip -n "${ns[$i]}" addr add "$net.$((i + 1))/24" dev "p$tag$i"
    ip -n "${ns[$i]}" link set "p$tag$i" up
    ip -n "${ns[$i]}" link set lo up
  done
}

# status_step: the step the job's status.json (under $work/hosts) says.
status_step() {
  /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["step"])' \
    "$work/hosts/status.json"
}

# netns_addr I: the address of namespace I.
netns_addr() { echo "$net.$(($1 + 1))"; }

# netns_link I down|up: cuts (or restores) namespace I's link to the bridge.
netns_link() { ip link set "v$tag$1" "$2"; }

# netns_start I LOG DIR CMD...: runs CMD in namespace I, in directory DIR,
# output to LOG; its pid is $started (and goes at exit).
netns_start() {
  local i=$1 log=$2 dir=$3
  shift 3
  (cd "$dir" && exec ip netns exec "${ns[$i]}" "$@") >"$log" 2>&1 &
  started=$!
  pids+=("$started")
}

# netns_kill_host I: SIGKILL for everything in namespace I (a lost node).
netns_kill_host() {
  for pid in $(ip netns pids "${ns[$1]}" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
}

# spec NAME STATE_DIR STEPS EXTRA: the job, 2 nodes of 1 rank; EXTRA is
# appended (more tables, faults).
spec() {
  cat <<TOML
[job]
name = "$1"
command = ["$train", "--steps", "$3", "--layers", "2", "--d-model", "64", "--context", "64",
           "--global-batch", "16", "--micro-batch", "8", "--threads", "1", "--log-every", "5",
           "--eval-batches", "1", "--sample-tokens", "16", "--data", "/usr/share/games/fortunes"]
nodes = 2
ranks_per_node = 1
state_dir = "$2"
[recovery]
repair_delay = "1s"
backoff_initial = "0s"
$4
TOML
}

fingerprint() {  # fingerprint REPORT
  /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["param_fingerprint"])' "$1"
}

# reference_run STEPS CHECKPOINT_TABLE: the same job without faults on one
# machine; sets $reference to its parameters' fingerprint.
reference_run() {
  spec reference "$work/reference" "$1" "$2" >"$work/reference.toml"
  "$endure" run "$work/reference.toml" --quiet >"$work/reference.out" 2>&1 ||
    { cat "$work/reference.out"; echo "FAIL: the reference run failed"; exit 1; }
  reference=$(fingerprint "$work/reference/report.json")
}

# tls_and_token NODES CONTROLLER_ADDRESS...: certificates in $work/tls (each
# valid for every address given: standby controllers share the controller
# certificate), the job token in $work/token.
tls_and_token() {
  local nodes=$1 hosts=()
  shift
  for h in "$@"; do hosts+=(--host "$h"); done
  "$endure" certs --dir "$work/tls" --nodes "$nodes" "${hosts[@]}" >/dev/null
  head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/token"
  chmod 600 "$work/token"
}

# await_file FILE LOG: waits up to 30 s for FILE to be non-empty.
await_file() {
  for _ in $(seq 1 300); do
    [ -s "$1" ] && return 0
    sleep 0.1
  done
  cat "$2"
  echo "FAIL: $1 did not appear"
  exit 1
}

# await_log LOG REGEX [TIMEOUT_S]: waits (default 30 s) until LOG has a line
# matching REGEX (grep -E).
await_log() {
  local deadline=$((SECONDS + ${3:-30}))
  while [ $SECONDS -lt $deadline ]; do
    grep -qE "$2" "$1" 2>/dev/null && return 0
    sleep 0.05
  done
  cat "$1"
  echo "FAIL: no line matching '$2' in $1"
  exit 1
}

# netns_etcd I: a one-member etcd 3.4 (/usr/bin/etcd) in namespace I, its
# client port (2379) on the namespace's address, its peer port on loopback;
# data in $work/etcd, output in $work/etcd.log. Waits until it answers
# /health and sets $etcd_endpoint (HOST:PORT).
netns_etcd() {
  local client="http://$(netns_addr "$1"):2379" peer="http://127.0.0.1:2380"
  netns_start "$1" "$work/etcd.log" "$work" /usr/bin/etcd --name e --data-dir "$work/etcd" \
    --listen-client-urls "$client" --advertise-client-urls "$client" \
    --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
    --initial-cluster "e=$peer" --logger zap --log-level warn
  etcd_endpoint="$(netns_addr "$1"):2379"
  for _ in $(seq 1 300); do
    if ip netns exec "${ns[$1]}" /usr/bin/python3 - "$client/health" 2>/dev/null <<'PY'; then return 0; fi
import json, sys, urllib.request
sys.exit(0 if json.load(urllib.request.urlopen(sys.argv[1], timeout=1)).get("health") == "true" else 1)
PY
    sleep 0.1
  done
  cat "$work/etcd.log"
  echo "FAIL: etcd did not come up on $client"
  exit 1
}

# await_step STATE_DIR N [TIMEOUT_S]: waits until status.json says step >= N.
await_step() {
  local deadline=$((SECONDS + ${3:-120}))
  while [ $SECONDS -lt $deadline ]; do
    if /usr/bin/python3 - "$1/status.json" "$2" 2>/dev/null <<'PY'; then return 0; fi
import json, sys
sys.exit(0 if json.load(open(sys.argv[1])).get("step", 0) >= int(sys.argv[2]) else 1)
PY
    sleep 0.1
  done
  echo "FAIL: step $2 not reached"
  exit 1
}

# await_exit PID TIMEOUT_S: waits for PID (a child) and sets $code.
await_exit() {
  code=0
  timeout "$2" tail --pid="$1" -f /dev/null || code=124
  [ "$code" = 0 ] && { wait "$1" || code=$?; }
  return 0
}

# show LOG...: the tail of each log under $work.
show() {
  for f in "$@"; do echo "== $f"; tail -40 "$work/$f"; done
}
