"""Step progress of an unmodified PyTorch program, read from its optimizer.

A program that does not use the client library still steps an optimizer.
With torch 2.x, whose optimizers call global step hooks, the agent gives the
program this module without a change to it: every Python worker of a job
that reads no progress from its output (no ``[detection] progress_pattern``)
starts with ``ENDURE_AUTOSTEP=1`` and ``python/autostep`` on its
``PYTHONPATH``, whose ``sitecustomize`` calls :func:`install` at interpreter
start-up (and then runs the ``sitecustomize`` it stands in front of, such as
Debian's). :func:`install` imports nothing: it waits for the program's own
``import torch`` to load ``torch.optim.optimizer``, and registers there

- a global optimizer step hook: the first optimizer that steps is the
  program's (a second one, a GAN's discriminator, is not counted; one made
  after the first is gone takes its place); each of
  its steps is a step report, as ``Session.end_step`` sends it, without a
  loss (nothing to judge);
- at its first step, ``ready`` without a restore point, and steps counted
  from the optimizer's own count where it keeps one (Adam, AdamW and most
  others torch ships keep ``state[p]["step"]``, restored with the program's
  own checkpoint): the controller takes the step before the first one
  reported as the restore point (docs/progress_pattern.md, "Restore
  points"); an optimizer that keeps no count (plain SGD) starts at 1, so a
  program that resumed its own checkpoint reads as one that started over;
- a global forward pre-hook: a forward pass without gradients (an
  evaluation under ``torch.no_grad()`` or ``torch.inference_mode()``) puts
  the rank in phase ``"eval"`` until its next optimizer step, so that an
  evaluation is judged by its own learned timeout, not a step's;
- ``torch.save`` and safetensors' ``save_file`` and ``save_model`` (what
  the Trainer and Lightning save checkpoints with) run in phase
  ``"checkpoint"``, also where a module imported them under a name of its
  own before the first step: a save, the final one too, is no hang;
- the faults injected into the rank that end or stop it (``kill``,
  ``exit``, ``hang``, ``log``, keyed to a step as for any program) fire
  between two optimizer steps, as ``Session.begin_step`` fires them.

The program's hang stacks come from ``faulthandler``, as with the client.
A program that makes its own :class:`endure.Session` reports itself: this
module then stays out. Nothing here raises into the program: an error
disables it with one line on stderr.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
import weakref
from typing import Optional

#: The environment variable the agent sets to "1" to ask for this module.
ENV = "ENDURE_AUTOSTEP"

_MODULE = "torch.optim.optimizer"

_disabled = False
_session = None
_optimizer: Optional[weakref.ref] = None
_steps = 0  # steps the program has completed, as reported
_in_eval = False
_grad_enabled = None  # torch.is_grad_enabled, once torch is loaded


def install() -> None:
    """Arms the hooks when the agent asked for them (``ENDURE_AUTOSTEP=1``
    and an agent socket); imports nothing."""
    if os.environ.get(ENV) != "1" or not os.environ.get("ENDURE_AGENT_SOCKET"):
        return
    module = sys.modules.get(_MODULE)
    if module is not None:
        _register(module)
    elif not any(isinstance(f, _Watcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _Watcher())


class _Watcher(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when torch.optim.optimizer is being imported,
    asks the finders behind it for the module and registers the hooks once
    it has run."""

    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_and_register(module):
            exec_module(module)
            _register(module)

        loader.exec_module = exec_and_register
        return spec


def _disable(why: str) -> None:
    global _disabled
    if not _disabled:
        _disabled = True
        print(f"endure.autostep: off: {why}", file=sys.stderr, flush=True)


def _register(module) -> None:
    register = getattr(module, "register_optimizer_step_post_hook", None)
    if register is None:
        # torch 1.x: no global step hooks; progress_pattern is the way.
        return
    try:
        register(_on_step)
    except Exception as e:  # never into the program
        _disable(f"cannot register the optimizer step hook: {e!r}")


def _optimizer_steps(optimizer) -> Optional[int]:
    """The steps the optimizer has taken, this one included, as its state
    counts them (None: it counts none)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p)
            if state and "step" in state:
                step = state["step"]
                return int(step.item() if hasattr(step, "item") else step)
    return None


def _start(optimizer) -> bool:
    """The first step of the program's optimizer: the session and ready."""
    global _session, _steps
    import endure  # noqa: PLC0415  (only once the program trains)
    if endure._sessions_made:
        _disable("the program reports its steps through its own endure.Session")
        return False
    session = endure.Session._autostep()
    if not session.active:
        _disable("no agent")
        return False
    # The program restores its own checkpoints, which Endure never sees: its
    # first step says what it restored, and the time trained after that is
    # recompute (the ledger waits for it, docs/progress_pattern.md).
    session.ready(None)
    done = _optimizer_steps(optimizer)
    _steps = done if done is not None and done >= 1 else 1
    import torch  # noqa: PLC0415  (loaded by now)
    global _grad_enabled
    _grad_enabled = torch.is_grad_enabled
    _session = session
    torch.nn.modules.module.register_module_forward_pre_hook(_on_forward)
    _wrap_saves(torch)
    return True


def _wrap_saves(torch) -> None:
    """Every name the loaded modules have for a save function now calls it
    in phase "checkpoint"; modules imported later find the wrapped ones."""
    saves = [torch.serialization.save]
    safetensors = sys.modules.get("safetensors.torch")
    if safetensors is not None:
        saves += [getattr(safetensors, n) for n in ("save_file", "save_model")
                  if callable(getattr(safetensors, n, None))]
    wrapped = {id(f): (f, _in_checkpoint_phase(f)) for f in saves}
    for module in list(sys.modules.values()):
        names = getattr(module, "__dict__", None)
        if not isinstance(names, dict):
            continue
        for name, value in list(names.items()):
            pair = wrapped.get(id(value))
            if pair is not None and pair[0] is value:
                names[name] = pair[1]


def _in_checkpoint_phase(save):
    """`save`, run in phase "checkpoint" (and back to the phase it was in)."""

    def saving(*args, **kwargs):
        previous = None
        if not _disabled:
            try:
                previous = _session.current_phase
                _session.phase("checkpoint")
            except Exception as e:  # never into the program
                _disable(f"{e!r}")
        try:
            return save(*args, **kwargs)
        finally:
            if previous is not None and not _disabled:
                try:
                    _session.phase(previous)
                except Exception as e:  # never into the program
                    _disable(f"{e!r}")

    saving.__wrapped__ = save
    saving.__name__ = getattr(save, "__name__", "save")
    saving.__doc__ = getattr(save, "__doc__", None)
    return saving


def _on_step(optimizer, args, kwargs) -> None:
    global _optimizer, _steps, _in_eval
    if _disabled:
        return
    try:
        if _optimizer is None:
            _optimizer = weakref.ref(optimizer)
            if not _start(optimizer):
                return
        elif _optimizer() is optimizer:
            _steps += 1
        elif _optimizer() is None:
            # The program made a new one (a second stage of training): it
            # goes on counting.
            _optimizer = weakref.ref(optimizer)
            _steps += 1
        else:
            return
        if _in_eval:
            _in_eval = False
            _session.phase("train")
        _session.end_step(_steps - 1)
        _session.begin_step(_steps)  # the next one: its faults fire here
    except Exception as e:  # never into the program
        _disable(f"{e!r}")


def _on_forward(module, args):
    global _in_eval
    if _in_eval or _disabled or _grad_enabled():
        return None
    try:
        _in_eval = True
        _session.phase("eval")
    except Exception as e:  # never into the program
        _disable(f"{e!r}")
    return None
