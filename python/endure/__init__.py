"""Endure's client library for Python training programs.

A :class:`Session` reports the program's progress to the node's Endure agent
(ready, per-step loss and timings, heartbeats from a background thread),
fires the faults injected into this rank (``kill``, ``exit``, ``hang``,
``nan``, ``slow``, ``log``, ``bitflip``, ``comm-fail``, ``comm-slow``), says
which phase the rank is in (``with session.phase("eval"): ...``), reports
parameter fingerprints for the silent-data-corruption check, and hands the
program the agent's instructions for this generation (restore point,
checkpoint directory, steps to skip).
Checkpoints of ``state_dict``s go through :class:`endure.torch.Checkpointer`.

Without an agent (the program runs bare or under torchrun) a session is
inactive and every call is a cheap no-op, so the same script runs anywhere::

    import endure
    session = endure.Session.from_env()
    session.ready(start_step)
    for step in range(start_step, steps):
        session.begin_step(step)
        loss = train_one_step(step)       # session.before_collective(step) before
                                          # the gradient allreduce
        flip = session.bitflip_due(step)  # after the optimizer step
        if flip:
            endure.torch.apply_bitflip(model.parameters(), flip)
        if session.fingerprint_due(step):
            session.report_fingerprint(step, endure.fingerprint(model.named_parameters()))
        loss = session.end_step(step, loss=loss)
        if (step + 1) % 100 == 0:
            with session.phase("eval"):   # a long evaluation is not a hang
                evaluate()

The protocol is implemented once, in the C++ client library; this package
binds it (``endure._endure``) and adds what Python programs need: stack dumps
of every Python thread on a hang (faulthandler, on a signal the agent sends)
and the torch helpers. Steps are 0-based indices, as in the C++ API.

Importing ``endure`` does not import torch.
"""

from __future__ import annotations

import collections
import faulthandler
import math
import os
import signal
import sys
import time
from typing import Optional

from . import _endure
from ._endure import DataLossError

__all__ = ["Session", "BitFlip", "DataLossError", "await_assignment", "fingerprint",
           "seconds_since_process_start"]

#: The bit an injected ``bitflip`` fault flips: parameter tensor ``tensor``
#: (in ``model.parameters()`` order, modulo their count), element ``element``
#: (modulo its elements), bit ``bit`` (modulo its dtype's width; float32 bit 30
#: is an exponent bit). Apply it with :func:`endure.torch.apply_bitflip`.
BitFlip = collections.namedtuple("BitFlip", ["tensor", "element", "bit"])

# Sessions the program made (from_env): endure.autostep stays out of a
# program that reports its steps itself.
_sessions_made = 0

# The signal on which a Python worker dumps its stacks into
# ENDURE_STACKS_FILE; the agent sends it when it captures stacks on a hang.
STACK_SIGNAL = signal.SIGUSR2


def seconds_since_process_start() -> float:
    """Seconds since this process started (interpreter start-up included)."""
    return _endure.seconds_since_process_start()


def _sync_environ() -> None:
    """os.environ is a copy of the C environment made at start-up: after the
    library changed the C one (a standby's assignment, a rejoin), the copy
    follows, so that torch.distributed's env:// reads the new values."""
    current = _endure.c_environ()
    for key in [k for k in os.environ if k not in current]:
        del os.environ[key]
    for key, value in current.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def await_assignment() -> None:
    """For a warm standby (``[recovery] warm_standby``): call it after the
    program's imports and before anything that depends on the rank (reading
    RANK or WORLD_SIZE, ``Session.from_env``, ``init_process_group``). The
    agent starts a standby interpreter ahead of need, with ENDURE_STANDBY=1;
    it waits here, with torch and the program's modules loaded, until the
    agent hands it a failed rank's environment, which it takes into
    os.environ, and returns. A standby the agent discards exits here with
    code 0. Without ENDURE_STANDBY it returns at once."""
    if os.environ.get("ENDURE_STANDBY") != "1":
        return
    _warm_torch()
    _endure.await_standby_assignment()
    _sync_environ()


def _warm_torch() -> None:
    """What a replacement would otherwise load after its assignment: torch
    2.x's first DistributedDataParallel imports torch._dynamo (and sympy),
    0.9 s here. Only when the program imported torch already."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "compile"):
        return
    try:
        import torch._dynamo  # noqa: F401
    except Exception as e:  # never into the program
        print(f"endure: standby warm-up: {e!r}", file=sys.stderr, flush=True)


def fingerprint(named_tensors) -> str:
    """XXH3-64 over each (name, tensor)'s name and bytes, as 16 hex digits.

    The same ``param_fingerprint`` as endure-train prints: pass
    ``model.named_parameters()``. Tensors are read as contiguous CPU bytes.
    """
    keep = []
    refs = []
    for name, t in named_tensors:
        c = t.detach().cpu().contiguous()
        keep.append(c)
        refs.append((name, "uint8", [c.numel() * c.element_size()], c.data_ptr(),
                     c.numel() * c.element_size()))
    return _endure.fingerprint(refs)


class Session:
    """The link to this node's agent, for one training process.

    Create it with :meth:`from_env`. Thread safety: ``ready``, ``begin_step``,
    ``end_step`` and ``end_skipped_step`` belong to the training thread.
    """

    def __init__(self, impl: "_endure.Session"):
        self._impl = impl
        self._step_started: Optional[float] = None
        self._pending_comm_s = 0.0
        self._pending_stall_s = 0.0
        self._pending_checkpoint_step = -1
        self._stacks_file = None

    @classmethod
    def from_env(cls) -> "Session":
        """Reads the ENDURE_* variables the agent sets.

        Inactive without ENDURE_AGENT_SOCKET. Raises ValueError naming the
        variable when one is malformed. When the agent names a stacks file,
        registers a dump of every thread's Python stack on SIGUSR2 there and
        tells the agent, so that a hang's incident shows Python frames.
        """
        global _sessions_made
        _sessions_made += 1
        session = cls(_endure.Session.from_env())
        session._register_stack_dump()
        return session

    @classmethod
    def _autostep(cls) -> "Session":
        """from_env, for endure.autostep: not counted as the program's."""
        session = cls(_endure.Session.from_env())
        session._register_stack_dump()
        return session

    @classmethod
    def disabled(cls) -> "Session":
        """A session that reports nothing and injects nothing."""
        return cls(_endure.Session.disabled())

    def _register_stack_dump(self) -> None:
        path = self._impl.stacks_file
        if not self._impl.active or not path:
            return
        if self._stacks_file is not None:
            if self._stacks_file.name == path:
                return
            faulthandler.unregister(STACK_SIGNAL)
            self._stacks_file.close()
            self._stacks_file = None
        try:
            # Kept open for the life of the process: faulthandler writes to
            # its file descriptor from the signal handler.
            self._stacks_file = open(path, "w")
        except OSError:
            return  # the agent falls back to gdb
        faulthandler.register(STACK_SIGNAL, file=self._stacks_file, all_threads=True,
                              chain=False)
        self._impl.announce_stack_signal(int(STACK_SIGNAL))

    # ---- what the agent said ----

    @property
    def active(self) -> bool:
        """True when reporting to an agent."""
        return self._impl.active

    @property
    def rank(self) -> int:
        return self._impl.rank

    @property
    def generation(self) -> int:
        return self._impl.generation

    @property
    def checkpoint_dir(self) -> str:
        """The durable checkpoint directory the agent names; "" when none."""
        return self._impl.checkpoint_dir

    @property
    def checkpoint_every(self) -> Optional[int]:
        """Steps between checkpoints the agent asks for; None: not set."""
        return self._impl.checkpoint_every

    @property
    def restore_step(self) -> Optional[int]:
        """-1: newest checkpoint; 0: fresh start; N: newest at or before N."""
        return self._impl.restore_step

    @property
    def restore_plan(self) -> Optional[dict]:
        """The agent's restore point across the tiers, or None."""
        return self._impl.restore_plan

    @property
    def memory_checkpoints(self) -> bool:
        """Whether checkpoints go to node memory (the T0 tier)."""
        return self._impl.memory_checkpoints

    @property
    def skip_steps(self) -> list:
        """1-based step numbers whose data and update are to be skipped."""
        return list(self._impl.skip_steps)

    @property
    def dropped(self) -> int:
        """Reports dropped because the agent could not take them."""
        return self._impl.dropped

    def should_skip(self, step: int) -> bool:
        """Whether step index `step` is to be skipped (a bad batch)."""
        return self._impl.should_skip(step)

    # ---- phases ----

    @property
    def current_phase(self) -> str:
        """The phase this rank is in: "train" until :meth:`phase` says otherwise."""
        return self._impl.current_phase

    def phase(self, name: str) -> "_PhaseScope":
        """This rank enters phase `name` ("eval", "checkpoint", "data",
        "train", or a name of its own matching ``^[a-z][a-z0-9_]{0,31}$``) now,
        so that the agent times it on its own: a long evaluation is not a hang.
        Used as a context manager, returns to the previous phase on exit::

            with session.phase("eval"):
                evaluate()

        Raises ValueError for a bad name (the phase is then unchanged).
        """
        previous = self._impl.current_phase
        self._impl.phase(name)
        return _PhaseScope(self._impl, previous)

    # ---- silent data corruption check ----

    @property
    def sdc_check_every(self) -> int:
        """Steps between parameter fingerprints (ENDURE_SDC_CHECK_EVERY; 0: off)."""
        return self._impl.sdc_check_every

    def fingerprint_due(self, step: int) -> bool:
        """Whether the parameters after the optimizer step of index `step` are
        to be fingerprinted (:meth:`report_fingerprint`)."""
        return self._impl.fingerprint_due(int(step))

    def report_fingerprint(self, step: int, fingerprint: str) -> None:
        """Reports :func:`fingerprint` of the parameters after the optimizer
        step of index `step`. Raises ValueError for a string that is not 16
        lowercase hex digits."""
        self._impl.report_fingerprint(int(step), fingerprint)

    # ---- faults inside the step ----

    def bitflip_due(self, step: int) -> Optional[BitFlip]:
        """After the optimizer step of index `step`: the bit an injected
        ``bitflip`` fault flips now (once), or None. Apply it with
        :func:`endure.torch.apply_bitflip` before any fingerprint."""
        flip = self._impl.bitflip_due(int(step))
        return None if flip is None else BitFlip(*flip)

    def before_collective(self, step: int) -> float:
        """Call right before step `step`'s gradient allreduce. An injected
        ``comm-fail`` exits the process with 1 here (its message on stderr);
        a ``comm-slow`` sleeps. Returns the seconds it held the step, which
        :meth:`end_step` reports as communication time (unless given comm_s)
        and leaves out of its default compute_s."""
        start = time.monotonic()
        self._impl.before_collective(int(step))
        held = time.monotonic() - start
        self._pending_comm_s += held
        return held

    # ---- in-process restart (endure.torch.Loop uses these) ----

    @property
    def rejoin_offered_here(self) -> bool:
        """Whether the agent offers this process later generations in place
        (``[recovery] in_process``)."""
        return self._impl.rejoin_offered_here

    @property
    def peer_restore(self) -> bool:
        """This rank started fresh into a generation whose other ranks kept
        their state: it takes the state from them, not from the tiers."""
        return self._impl.peer_restore

    def declare_rejoin(self, from_tiers: bool = False) -> None:
        """This process rejoins later generations in place (call before
        `ready`); the controller may then replace only a failed peer.
        `from_tiers`: each rank holds its own part of the state (sharded),
        which every rank restores from the checkpoint tiers after a rejoin
        (the generation then carries a restore plan); otherwise the ranks
        that kept the state hand it to the fresh ones."""
        self._impl.declare_rejoin(from_tiers)

    def rejoin_pending(self) -> bool:
        """Whether the agent offered a generation later than this one. After
        `declare_rejoin`, what the session's own thread last read of the
        offer file (every 10 ms): cheap enough for every layer of a step;
        before it, a read of the file."""
        return self._impl.rejoin_pending()

    def rejoin(self, timeout_s: float) -> bool:
        """Waits up to `timeout_s` for the offer of a later generation and
        takes it: its variables (RANK, WORLD_SIZE, MASTER_PORT, ENDURE_*) go
        into os.environ, and the session is the new generation's. False when
        none came in time; ValueError for a malformed offer."""
        if not self._impl.rejoin(float(timeout_s)):
            return False
        _sync_environ()
        self._register_stack_dump()  # each generation has its own stacks file
        return True

    # ---- progress ----

    def declare_deterministic(self) -> None:
        """Says that this program computes the same loss bit for bit when it
        replays a step from the same state and data (fixed seeds, deterministic
        kernels, a fixed-order reduction). Call before `ready`. A loss anomaly
        is then judged by replaying its step: a loss that comes back bit for
        bit is the data's and training goes on through it; one that changes was
        a fault, and its rank's node is struck. See [anomaly] in
        docs/job_spec.md."""
        self._impl.declare_deterministic()

    def ready(self, start_step: Optional[int], restore_s: float = 0.0,
              init_s: Optional[float] = None) -> None:
        """After the restore, before the first step: training starts at index
        `start_step`; `restore_s` was spent restoring, `init_s` (default: the
        time since the process started) getting here. `start_step` None: the
        program does not know what it restored (a checkpoint of its own); the
        first step it reports says, and the step before it is taken as the
        restore point."""
        if init_s is None:
            init_s = seconds_since_process_start()
        if start_step is None:
            self._impl.ready_at_unknown_step(float(restore_s), float(init_s))
        else:
            self._impl.ready(int(start_step), float(restore_s), float(init_s))

    def begin_step(self, step: int) -> None:
        """Step index `step` is about to run. Injected kill, exit, hang and
        log faults of this rank fire here."""
        self._step_started = time.monotonic()
        self._impl.begin_step(int(step))

    def set_total_steps(self, steps: int) -> None:
        """The steps this run trains in all, sent with every step from now
        on: the controller weighs what a straggler costs over the remaining
        ones (0: unknown)."""
        self._impl.set_total_steps(int(steps))
        self._total_steps = int(steps)

    def end_step(self, step: int, loss=None, compute_s: Optional[float] = None,
                 comm_s: Optional[float] = None, tokens: Optional[int] = None):
        """Step index `step` finished. Returns the loss to log: NaN when an
        injected `nan` fault is due, `loss` (as a float; None without one)
        otherwise.

        `loss` may be a float or a one-element tensor (None: not known).
        `compute_s` defaults to the time since :meth:`begin_step`, `comm_s` to
        the time :meth:`before_collective` held the step (0 without it). `tokens`: tokens the whole job processed in the step (for tokens/s).
        The stall and step of a checkpoint saved since the last call are
        reported with it.
        """
        # Without a loss the step still counts as progress; the agent then
        # has no loss to judge (a NaN would be judged an anomaly).
        value = None if loss is None else float(loss.item() if hasattr(loss, "item") else loss)
        if compute_s is None:
            started = self._step_started
            compute_s = time.monotonic() - started if started is not None else 0.0
            compute_s = max(0.0, compute_s - self._pending_stall_s - self._pending_comm_s)
        if comm_s is None:
            comm_s = self._pending_comm_s
        if tokens is not None:
            self._impl.set_tokens_per_step(int(tokens))
        logged = self._impl.end_step(int(step), value, float(compute_s),
                                     float(comm_s), self._pending_stall_s,
                                     self._pending_checkpoint_step)
        self._pending_comm_s = 0.0
        self._pending_stall_s = 0.0
        self._pending_checkpoint_step = -1
        self._step_started = None
        return logged

    def end_skipped_step(self, step: int) -> None:
        """Step index `step` was skipped (:meth:`should_skip`)."""
        self._impl.end_skipped_step(int(step), self._pending_stall_s,
                                    self._pending_checkpoint_step)
        self._pending_comm_s = 0.0
        self._pending_stall_s = 0.0
        self._pending_checkpoint_step = -1

    def _note_checkpoint(self, stall_s: float, committed_step: int) -> None:
        """Called by the Checkpointer: reported with the next end_step."""
        self._pending_stall_s += stall_s
        if committed_step >= 0:
            self._pending_checkpoint_step = committed_step


class _PhaseScope:
    """What :meth:`Session.phase` returns: the phase is entered already; as a
    context manager, the previous phase is entered again on exit."""

    def __init__(self, impl, previous: str):
        self._impl = impl
        self._previous = previous

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._impl.phase(self._previous)
        return False
