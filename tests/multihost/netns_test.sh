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
# shellcheck source=netns_lib.sh
source "$(dirname "$0")/netns_lib.sh"
netns_setup c h0 h1
controller_ip=$(netns_addr 0)

# The reference: the same job, no faults, on one machine.
reference_run 30 "[checkpoint]
every_steps = 5"

spec hosts "$work/hosts" 30 '[checkpoint]
every_steps = 5
[[faults]]
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

PYTHONPATH=$(dirname "$0") /usr/bin/python3 - "$work" "$reference" <<'PY' || { show; exit 1; }
import json, sys
import netns_checks
report, reference = netns_checks.report(sys.argv[1]), sys.argv[2]
fail = netns_checks.completed_bit_exact(report, reference)
incidents = report.get("incidents", [])
if len(incidents) != 1 or "SIGKILL" not in incidents[0].get("cause", "") + incidents[0].get("reason", ""):
    fail.append("expected one incident, the kill: " + json.dumps(incidents))
if fail:
    print("FAIL: " + "; ".join(fail))
    sys.exit(1)
print("ok: completed across 3 namespaces, fingerprint %s, incident %s" %
      (reference, incidents[0].get("cause")))
PY
