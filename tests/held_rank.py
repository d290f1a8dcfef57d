"""For the Python-driven integration tests: a rank held in a step by an
injected hang whose timeout is far away, found so that the test itself can
end it (SIGKILL) once the events it waits for have happened. A test ordered
by those events, not by how fast the machine reaches a step."""
import os


def hold_fault(fault_id, rank, step):
    """The spec's entries that hold `rank` in `step` (TOML; a [detection]
    table and one [[faults]] entry)."""
    return ('[detection]\nhang_timeout_floor = "10m"\n'
            '[[faults]]\nid = "%s"\nkind = "hang"\nrank = %d\nstep = %d\n' % (fault_id, rank, step))


def held_rank_pid(state, rank, step):
    """The pid of `rank` of generation 0 of the job whose state directory is
    `state`, once its log says it hangs in `step` (the client prints
    "injected fault ...: hanging in step N"); None before that."""
    nodes = os.path.join(state, "nodes")
    logs = [os.path.join(nodes, n, "logs", "gen0-rank%d.log" % rank)
            for n in (os.listdir(nodes) if os.path.isdir(nodes) else [])]

    def says_held(path):
        with open(path, errors="replace") as f:
            return ("hanging in step %d" % step) in f.read()

    if not any(os.path.exists(path) and says_held(path) for path in logs):
        return None
    return rank_pid(state, rank)


def rank_pid(state, rank):
    """The pid of `rank` of generation 0 of the job whose state directory is
    `state` (its stacks file, in its environment, names it); None before it
    runs."""
    stacks = ("gen0-rank%d.stacks" % rank).encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if any(e.startswith(b"ENDURE_STACKS_FILE=" + state.encode()) and e.endswith(stacks)
               for e in env):
            return int(pid)
    return None
