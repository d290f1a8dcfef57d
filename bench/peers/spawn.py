#!/usr/bin/env python3
"""Starts a peer runtime's job the way its documentation does, for
bench/python_recovery_bench.py:

  spawn.py ranks N PORT -- COMMAND...
      N processes of COMMAND, ranks 0..N-1 of one world (RANK, WORLD_SIZE,
      LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT=PORT),
      as NVIDIA resiliency-ext's in-process wrapper runs: nothing restarts a
      process that dies (the wrapper goes on with the ranks that remain).
  spawn.py torchft N PORT -- COMMAND...
      torchft: a lighthouse on PORT (--min_replicas 1, as torchft's README)
      and N replica groups of one rank each, each under torchrun with
      --max-restarts (REPLICA_GROUP_ID, NUM_REPLICA_GROUPS,
      TORCHFT_LIGHTHOUSE), so that a killed replica is restarted and heals
      from a live one.

Exits when every rank (replica group) has exited, with the worst exit code.
Its output is its children's, interleaved."""

import os
import subprocess
import sys
import time


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv):
    if len(argv) < 5 or argv[0] not in ("ranks", "torchft") or argv[3] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    mode, n, port, command = argv[0], int(argv[1]), int(argv[2]), argv[4:]
    base = dict(os.environ, MASTER_ADDR="127.0.0.1")
    helpers, procs = [], []
    if mode == "ranks":
        for rank in range(n):
            env = dict(base, RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(n), MASTER_PORT=str(port))
            procs.append(subprocess.Popen(command, env=env))
    else:
        bin_dir = os.path.dirname(sys.executable)
        helpers.append(subprocess.Popen(
            [os.path.join(bin_dir, "torchft_lighthouse"), "--min_replicas", "1",
             "--quorum_tick_ms", "100", "--join_timeout_ms", "10000",
             "--bind", f"127.0.0.1:{port}"]))
        time.sleep(0.5)  # the lighthouse listens (a replica retries its connection anyway)
        for group in range(n):
            env = dict(base, REPLICA_GROUP_ID=str(group), NUM_REPLICA_GROUPS=str(n),
                       TORCHFT_LIGHTHOUSE=f"http://127.0.0.1:{port}")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
                 "--nproc_per_node", "1", "--max_restarts", "1000", "--tee", "3",
                 "--master_addr", "127.0.0.1", "--master_port", str(free_port())] + command,
                env=env))
    worst = 0
    for p in procs:
        code = p.wait()
        worst = code if worst == 0 else worst
    for h in helpers:
        h.kill()
        h.wait()
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
