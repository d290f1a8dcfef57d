#!/usr/bin/env bash
# Multi-host for real: the controller and two agents each in a Linux network
# namespace of its own (veth pairs on a bridge, addresses 10.213.N.1-3), so
# that every address, port and path decision is made on the right host. The
# links are beyond loopback, so they use mutual TLS (`endure certs`). A job of
# two nodes with a rank killed at step 12 must complete with the parameters of
# the same job run without faults on one machine.
#
# Usage: netns_test.sh ENDURE_BIN ENDURE_TRAIN_BIN
# Needs root and iproute2; exits 77 (ctest: skipped) with a message when it
# cannot make network namespaces.
set -euo pipefail

endure=$1
train=$2
skip() {
  echo "SKIP: $*"
  exit 77
}
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces"
command -v ip >/dev/null || skip "needs iproute2 (ip)"

tag=$$
net=10.213.$((tag % 250))
work=$(mktemp -d /tmp/endure_netns.XXXXXX)
names=(c h0 h1)
ns=()
for n in "${names[@]}"; do ns+=("endure-$n-$tag"); done
bridge="enb$tag"
pids=()

cleanup() {
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for n in "${ns[@]}"; do
    # Whatever still runs in the namespace (workers) goes with it.
    for pid in $(ip netns pids "$n" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$n" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
  [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

ip netns add "${ns[0]}" 2>/dev/null || skip "cannot create a network namespace here"
ip netns add "${ns[1]}"
ip netns add "${ns[2]}"
ip link add "$bridge" type bridge
ip link set "$bridge" up
for i in 0 1 2; do
  ip link add "v$tag$i" type veth peer name "p$tag$i"
  ip link set "p$tag$i" netns "${ns[$i]}"
  ip link set "v$tag$i" master "$bridge" up
  ip -n "${ns[$i]}" addr add "$net.$((i + 1))/24" dev "p$tag$i"
  ip -n "${ns[$i]}" link set "p$tag$i" up
  ip -n "${ns[$i]}" link set lo up
done
controller_ip=$net.1

spec() {  # spec NAME STATE_DIR EXTRA
  cat <<TOML
[job]
name = "$1"
command = ["$train", "--steps", "30", "--layers", "2", "--d-model", "64", "--context", "64",
           "--global-batch", "16", "--micro-batch", "8", "--threads", "1", "--log-every", "5",
           "--eval-batches", "1", "--sample-tokens", "16", "--data", "/usr/share/games/fortunes"]
nodes = 2
ranks_per_node = 1
state_dir = "$2"
[checkpoint]
every_steps = 5
[recovery]
repair_delay = "1s"
backoff_initial = "0s"
$3
TOML
}

fingerprint() {  # fingerprint REPORT
  /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["param_fingerprint"])' "$1"
}

# The reference: the same job, no faults, on one machine.
spec reference "$work/reference" "" >"$work/reference.toml"
"$endure" run "$work/reference.toml" --quiet >"$work/reference.out" 2>&1 ||
  { cat "$work/reference.out"; echo "FAIL: the reference run failed"; exit 1; }
reference=$(fingerprint "$work/reference/report.json")

spec hosts "$work/hosts" '[[faults]]
kind = "kill"
rank = 1
step = 12' >"$work/hosts.toml"
mkdir -p "$work/hosts"
"$endure" certs --dir "$work/tls" --nodes node0,node1 --host "$controller_ip" >/dev/null
head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/token"
chmod 600 "$work/token"

ip netns exec "${ns[0]}" "$endure" controller --spec "$work/hosts.toml" \
  --listen "$controller_ip:0" --tls-dir "$work/tls" --token-file "$work/token" \
  --address-file "$work/controller.addr" >"$work/controller.log" 2>&1 &
controller=$!
pids+=("$controller")
for _ in $(seq 1 300); do
  [ -s "$work/controller.addr" ] && break
  sleep 0.1
done
[ -s "$work/controller.addr" ] || { cat "$work/controller.log"; echo "FAIL: no controller"; exit 1; }
address=$(cat "$work/controller.addr")
case "$address" in
  "$controller_ip":*) ;;
  *) echo "FAIL: the controller says it listens on $address, not on $controller_ip"; exit 1 ;;
esac

for i in 0 1; do
  ip netns exec "${ns[$((i + 1))]}" "$endure" agent --controller "$address" --node-id "node$i" \
    --host "$net.$((i + 2))" --tls-dir "$work/tls" --token-file "$work/token" \
    --work-dir "$work/hosts/nodes/node$i" >"$work/agent$i.log" 2>&1 &
  pids+=("$!")
done

# The controller ends with the job (exit 0 when training completed).
code=0
timeout 300 tail --pid="$controller" -f /dev/null || code=124
wait "$controller" || code=$?
show() {
  for f in controller.log agent0.log agent1.log; do echo "== $f"; tail -40 "$work/$f"; done
}
[ "$code" = 0 ] || { show; echo "FAIL: the controller exited with $code"; exit 1; }

report="$work/hosts/report.json"
/usr/bin/python3 - "$report" "$reference" <<'PY' || { show; exit 1; }
import json, sys
report, reference = json.load(open(sys.argv[1])), sys.argv[2]
fail = []
if not report.get("completed"):
    fail.append("the job did not complete: " + str(report.get("verdict")))
if report.get("param_fingerprint") != reference:
    fail.append("fingerprint %s, reference %s" % (report.get("param_fingerprint"), reference))
incidents = report.get("incidents", [])
if len(incidents) != 1 or "SIGKILL" not in incidents[0].get("cause", "") + incidents[0].get("reason", ""):
    fail.append("expected one incident, the kill: " + json.dumps(incidents))
if fail:
    print("FAIL: " + "; ".join(fail))
    sys.exit(1)
print("ok: completed across 3 namespaces, fingerprint %s, incident %s" %
      (reference, incidents[0].get("cause")))
PY
