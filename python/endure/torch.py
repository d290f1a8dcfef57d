"""Checkpoints of PyTorch training state through Endure's tiers.

:class:`Checkpointer` saves and restores a training state made of objects
with ``state_dict()`` / ``load_state_dict()`` (model, optimizer, LR
scheduler) and plain dicts of values and tensors (data position, RNG
states)::

    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler,
             "progress": {"epoch": 0}, "rng": {"torch": torch.get_rng_state()}}
    ckpt = endure.torch.Checkpointer(session, state, directory="ckpt")
    start = ckpt.restore()              # 0: fresh start
    session.ready(start, restore_s=ckpt.restore_s)
    for step in range(start, steps):
        ...
        ckpt.save(step + 1)             # the state after step + 1 steps
        session.end_step(step, loss=loss)

Under an agent with node memory (``[checkpoint] every_steps`` in the job
spec), ``save`` copies this rank's share of the tensors, as raw bytes and
without pickling, into the node's shared memory (tier T0) and returns: the
agent replicates it to a peer node (T1) and persists it (T2) behind training.
``restore`` loads what the agent's restore plan names, each shard from its
fastest tier, verified by checksum, broadcast to every rank over the default
``torch.distributed`` group. Without node memory (bare, under torchrun, or
``memory = false``) rank 0 commits the whole state to ``directory`` (or the
directory the agent names) atomically (tmp, fsync, rename, manifest) and
``restore`` loads the newest step there that verifies.

Values other than tensors (numbers, strings, lists, tuples, dicts, None,
bytes, numpy arrays) travel as JSON metadata; anything else is a TypeError
that names its key, since it could only be saved by pickling.
"""

from __future__ import annotations

import base64
import ctypes
import datetime
import gc
import json
import math
import numbers
import os
import struct
import sys
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Dict, List, Optional, Tuple

import torch

from . import _endure

__all__ = ["Checkpointer", "ExactGradients", "Loop", "PeerFailed", "apply_bitflip"]

_FORMAT = "endure-python-1"
_INT64_MAX = 2**63 - 1

_DTYPES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.int16: "int16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.bool: "bool",
}
_TORCH_DTYPES = {name: dtype for dtype, name in _DTYPES.items()}


def apply_bitflip(parameters, flip) -> str:
    """Flips the bit an injected ``bitflip`` fault names
    (:meth:`endure.Session.bitflip_due`) in place, in its raw bytes:
    `parameters` are the model's parameters in order (``model.parameters()``
    or ``model.named_parameters()``); the tensor is ``flip.tensor`` modulo
    their count. Returns the flipped parameter's name (its index without
    names). A tensor on a device is flipped through a CPU copy."""
    params = list(parameters)
    if not params:
        raise ValueError("apply_bitflip: no parameters")
    index = flip.tensor % len(params)
    entry = params[index]
    name, t = entry if isinstance(entry, tuple) else (str(index), entry)
    with torch.no_grad():
        host = t.detach()
        on_host = host.device.type == "cpu" and host.is_contiguous()
        if not on_host:
            host = host.cpu().contiguous()
        _endure.flip_bit(host.data_ptr(), host.numel(), host.element_size(), flip.element,
                         flip.bit)
        if not on_host:
            t.copy_(host)
    return name


def _where(path: Tuple) -> str:
    return "state" + "".join(f"[{p!r}]" for p in path)


class _Flattener:
    """Turns a state tree into JSON plus a list of named tensors."""

    def __init__(self):
        self.tensors: List[Tuple[str, torch.Tensor]] = []
        self.offsets: Dict[str, List[int]] = {}  # a DTensor's local shard: where it begins
        self._names = set()

    def _name(self, path: Tuple) -> str:
        base = "/".join(str(p) for p in path) or "tensor"
        name, n = base, 1
        while name in self._names:  # "0" and 0 as keys of one dict
            n += 1
            name = f"{base}#{n}"
        self._names.add(name)
        return name

    def _tensor(self, t: torch.Tensor, path: Tuple) -> str:
        if t.is_sparse or t.layout != torch.strided:
            raise TypeError(f"Checkpointer: {_where(path)} is a {t.layout} tensor; "
                            "only dense (strided) tensors can be saved")
        if t.dtype not in _DTYPES:
            raise TypeError(f"Checkpointer: {_where(path)} has dtype {t.dtype}, which is not "
                            f"supported (supported: {', '.join(_DTYPES.values())})")
        name = self._name(path)
        self.tensors.append((name, t))
        return name

    def _sharded(self, t, path: Tuple) -> dict:
        placements = [_placement_name(p, path) for p in t.placements]
        shape, offset = _local_shape_and_offset(t.shape, t.device_mesh, t.placements)
        local = t.to_local()
        if list(local.shape) != list(shape):
            raise TypeError(f"Checkpointer: {_where(path)} is a DTensor whose local shard "
                            f"{list(local.shape)} is not the {list(shape)} its layout gives "
                            "(uneven sharding), which cannot be saved")
        name = self._tensor(local, path)
        self.offsets[name] = [int(o) for o in offset]
        return {"S": name, "shape": list(t.shape), "placements": placements}

    def encode(self, value: Any, path: Tuple) -> Any:
        if value is None or isinstance(value, (bool, str)):
            return value
        if _is_dtensor(value):
            return self._sharded(value, path)
        if isinstance(value, torch.Tensor):
            return {"T": self._tensor(value, path)}
        if isinstance(value, numbers.Integral):
            v = int(value)
            return v if -_INT64_MAX - 1 <= v <= _INT64_MAX else {"I": str(v)}
        if isinstance(value, numbers.Real):
            v = float(value)
            return v if math.isfinite(v) else {"F": repr(v)}
        if isinstance(value, (bytes, bytearray)):
            return {"B": base64.b64encode(bytes(value)).decode("ascii")}
        if type(value).__module__ == "numpy" and hasattr(value, "dtype") and \
                hasattr(value, "tobytes"):
            if value.dtype.hasobject:
                raise TypeError(f"Checkpointer: {_where(path)} is a numpy array of objects, "
                                "which cannot be saved without pickling")
            raw = torch.frombuffer(bytearray(value.tobytes()), dtype=torch.uint8) \
                if value.nbytes > 0 else torch.empty(0, dtype=torch.uint8)
            return {"N": self._tensor(raw, path), "dtype": value.dtype.str,
                    "shape": list(value.shape)}
        if isinstance(value, tuple):
            return {"U": [self.encode(v, path + (i,)) for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [self.encode(v, path + (i,)) for i, v in enumerate(value)]
        if isinstance(value, Mapping):
            items = [[self.encode_key(k, path), self.encode(v, path + (k,))]
                     for k, v in value.items()]
            out = {"D": items}
            if isinstance(value, OrderedDict):
                out["O"] = 1
            return out
        raise TypeError(f"Checkpointer: {_where(path)} is a {type(value).__name__}, which "
                        "cannot be saved without pickling; store tensors, numbers, strings, "
                        "lists, tuples and dicts (for a generator, its get_state())")

    def encode_key(self, key: Any, path: Tuple) -> Any:
        if isinstance(key, torch.Tensor) or isinstance(key, Mapping) or isinstance(key, list):
            raise TypeError(f"Checkpointer: {_where(path)} has a key of type "
                            f"{type(key).__name__}, which cannot be saved")
        return self.encode(key, path + (key,))


def _decode(node: Any, tensors: Dict[str, torch.Tensor], where: str, sharded=None) -> Any:
    """The value `node` encodes; `sharded(node)` makes a DTensor entry's
    value (None: a checkpoint of a replicated state has none)."""
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, list):
        return [_decode(v, tensors, where, sharded) for v in node]
    if not isinstance(node, dict) or len(node) == 0:
        raise ValueError(f"{where}: malformed checkpoint metadata")
    if "S" in node:
        if sharded is None:
            raise ValueError(f"{where}: malformed checkpoint metadata (a sharded entry)")
        return sharded(node)
    if "T" in node:
        if node["T"] not in tensors:
            raise ValueError(f"{where}: checkpoint lacks tensor {node['T']!r}")
        return tensors[node["T"]]
    if "I" in node:
        return int(node["I"])
    if "F" in node:
        return float(node["F"])
    if "B" in node:
        return base64.b64decode(node["B"])
    if "N" in node:
        import numpy  # only states that held numpy arrays need it
        raw = tensors[node["N"]]
        data = bytes(_view(raw)) if raw.numel() else b""
        return numpy.frombuffer(data, dtype=numpy.dtype(node["dtype"])).reshape(
            node["shape"]).copy()
    if "U" in node:
        return tuple(_decode(v, tensors, where, sharded) for v in node["U"])
    if "D" in node:
        items = [(_hashable(_decode(k, tensors, where)), _decode(v, tensors, where, sharded))
                 for k, v in node["D"]]
        return OrderedDict(items) if node.get("O") else dict(items)
    raise ValueError(f"{where}: malformed checkpoint metadata")


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def _view(t: torch.Tensor):
    """The bytes of a contiguous CPU tensor, as a buffer, without a copy."""
    n = t.numel() * t.element_size()
    return (ctypes.c_char * n).from_address(t.data_ptr())


def _tensor_from(dtype: str, shape: List[int], data: bytearray, where: str) -> torch.Tensor:
    if dtype not in _TORCH_DTYPES:
        raise ValueError(f"{where}: unsupported dtype {dtype!r}")
    torch_dtype = _TORCH_DTYPES[dtype]
    if len(data) == 0:
        return torch.empty(shape, dtype=torch_dtype)
    return torch.frombuffer(data, dtype=torch_dtype).reshape(shape)


# ---- Sharded state (FSDP2's DTensor parameters and optimizer state) ----
#
# A DTensor's rank holds one block of the global tensor (its local shard).
# Each rank saves its own blocks with their global offsets; a restore builds
# the block the live layout gives this rank (whatever the world size now:
# a shrink re-shards) from the saved blocks that overlap it.


def _dtensor_class():
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        try:
            from torch.distributed._tensor import DTensor
        except ImportError:  # torch 1.x: no DTensor
            return None
    return DTensor


def _is_dtensor(value: Any) -> bool:
    cls = _dtensor_class() if isinstance(value, torch.Tensor) else None
    return cls is not None and isinstance(value, cls)


def _placement_name(placement, path: Tuple) -> str:
    if placement.is_shard():
        return f"S{placement.dim}"
    if placement.is_replicate():
        return "R"
    raise TypeError(f"Checkpointer: {_where(path)} is a DTensor with a {placement} placement "
                    "(a pending reduction), which cannot be saved")


def _placement(name: str, where: str):
    try:
        from torch.distributed.tensor import Replicate, Shard
    except ImportError:
        from torch.distributed._tensor import Replicate, Shard
    if name == "R":
        return Replicate()
    if name[:1] == "S" and name[1:].isdigit():
        return Shard(int(name[1:]))
    raise ValueError(f"{where}: malformed checkpoint metadata (placement {name!r})")


def _common_step(mine: List[int], world: int) -> int:
    """The newest step in every rank's `mine` (0: none)."""
    if world == 1:
        return max(mine, default=0)
    slots = 8  # more than a rank's T0 slots
    d = torch.distributed
    padded = torch.tensor((list(mine) + [-1] * slots)[:slots], dtype=torch.int64)
    every = [torch.zeros(slots, dtype=torch.int64) for _ in range(world)]
    d.all_gather(every, padded)
    common = set(mine)
    for t in every:
        common &= set(int(v) for v in t.tolist())
    common.discard(-1)
    return max(common, default=0)


def _all_ranks(ok: bool, world: int) -> bool:
    """Whether `ok` holds on every rank."""
    if world == 1:
        return ok
    flag = torch.tensor([1 if ok else 0], dtype=torch.int64)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
    return bool(flag.item())


def _local_shape_and_offset(shape, mesh, placements):
    try:
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    except ImportError:
        from torch.distributed._tensor._utils import compute_local_shape_and_global_offset
    local, offset = compute_local_shape_and_global_offset(shape, mesh, placements)
    return list(local), list(offset)


def _assemble(pieces, shape: List[int], offset: List[int], dtype, where: str) -> torch.Tensor:
    """The block of `shape` at global `offset`, from `pieces` ((offset,
    tensor) blocks of the same global tensor, saved under another layout).
    Raises DataLossError when the pieces leave part of it uncovered."""
    block = torch.empty(shape, dtype=dtype)
    covered = torch.zeros(shape, dtype=torch.bool)
    for at, piece in pieces:
        if len(at) != len(shape) or piece.dim() != len(shape):
            raise _endure.DataLossError(f"{where}: a saved block has {piece.dim()} dimensions, "
                                        f"the tensor {len(shape)}")
        mine, theirs = [], []
        for lo_mine, n_mine, lo_theirs, n_theirs in zip(offset, shape, at, piece.shape):
            lo, hi = max(lo_mine, lo_theirs), min(lo_mine + n_mine, lo_theirs + n_theirs)
            if hi <= lo:
                break
            mine.append(slice(lo - lo_mine, hi - lo_mine))
            theirs.append(slice(lo - lo_theirs, hi - lo_theirs))
        else:
            block[tuple(mine)] = piece[tuple(theirs)]
            covered[tuple(mine)] = True
    if not bool(covered.all()):
        raise _endure.DataLossError(f"{where}: the checkpoint's shards do not cover this "
                                    f"rank's block (offset {offset}, shape {shape})")
    return block


def _live_mesh(state: Mapping):
    """The device mesh of the first DTensor parameter of a module in
    `state`, or None."""
    for obj in state.values():
        if isinstance(obj, torch.nn.Module):
            for p in obj.parameters():
                if _is_dtensor(p):
                    return p.device_mesh
    return None


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's block on this rank; any other tensor itself."""
    return t.to_local() if _is_dtensor(t) else t


def _sharded_state(state: Mapping) -> bool:
    """Whether a module in `state` has DTensor parameters (FSDP2's
    fully_shard): each rank then holds a different part of the state."""
    return _live_mesh(state) is not None


def _sizes(value: Any, where: str) -> List[int]:
    """A shape or offset from a checkpoint's metadata, checked."""
    if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _INT64_MAX
            for v in value):
        raise ValueError(f"{where}: malformed checkpoint metadata (a shape or offset)")
    return value


def _contiguous_stride(shape: List[int]) -> Tuple[int, ...]:
    stride, n = [], 1
    for size in reversed(shape):
        stride.append(n)
        n *= max(size, 1)
    return tuple(reversed(stride))


class _Reshard:
    """Makes the DTensor entries of a sharded checkpoint for this rank of
    the live mesh, from the blocks of every shard read."""

    def __init__(self, shards, mesh, where: str):
        self._shards = shards  # [(offsets by name, tensors by name)]
        self._mesh = mesh
        self._where = where

    def __call__(self, node: dict):
        where = self._where
        name, shape = node.get("S"), _sizes(node.get("shape"), where)
        placements = node.get("placements")
        if not isinstance(placements, list):
            raise ValueError(f"{where}: malformed checkpoint metadata (placements)")
        placements = [_placement(p, where) for p in placements]
        if self._mesh is None or len(placements) != self._mesh.ndim:
            raise ValueError(f"{where}: the checkpoint's {name!r} is sharded over a mesh of "
                             f"{len(placements)} dimensions; the state's has "
                             f"{'none' if self._mesh is None else self._mesh.ndim}")
        pieces = [(_sizes(offsets[name], where), tensors[name])
                  for offsets, tensors in self._shards if name in tensors and name in offsets]
        if not pieces:
            raise _endure.DataLossError(f"{where}: no shard read holds {name!r}")
        local_shape, offset = _local_shape_and_offset(shape, self._mesh, placements)
        block = _assemble(pieces, local_shape, offset, pieces[0][1].dtype, f"{where}: {name!r}")
        if self._mesh.device_type != "cpu":
            block = block.to(self._mesh.device_type)
        return _dtensor_class().from_local(block, self._mesh, placements, run_check=False,
                                           shape=torch.Size(shape),
                                           stride=_contiguous_stride(shape))


def _dist():
    """(world size, rank, initialised) of the default torch.distributed group;
    before init_process_group, as torchrun's WORLD_SIZE and RANK say."""
    d = torch.distributed
    if d.is_available() and d.is_initialized():
        return d.get_world_size(), d.get_rank(), True
    try:
        return int(os.environ.get("WORLD_SIZE") or 1), int(os.environ.get("RANK") or 0), False
    except ValueError:
        raise ValueError("WORLD_SIZE and RANK must be integers, as torchrun sets them") from None


class Checkpointer:
    """Saves and restores `state` through the session's checkpoint tiers.

    `state` maps names to objects with ``state_dict()`` and
    ``load_state_dict()``, or to plain dicts, which ``restore`` updates in
    place. `directory` is where checkpoints go without node memory (the
    agent's ``checkpoint_dir`` takes precedence); `keep` committed steps are
    kept there. Raises TypeError naming the key for an entry of any other
    kind. Every rank of a data-parallel job holds the same state and calls
    ``save`` and ``restore`` at the same steps.
    """

    def __init__(self, session, state: Mapping, directory: Optional[str] = None,
                 keep: int = 3):
        if not isinstance(state, Mapping):
            raise TypeError(f"Checkpointer: state must be a dict of names to objects, "
                            f"not a {type(state).__name__}")
        for key, obj in state.items():
            if not isinstance(key, str):
                raise TypeError(f"Checkpointer: state key {key!r} is not a string")
            if isinstance(obj, Mapping):
                continue
            if not (callable(getattr(obj, "state_dict", None)) and
                    callable(getattr(obj, "load_state_dict", None))):
                raise TypeError(
                    f"Checkpointer: state[{key!r}] is a {type(obj).__name__}, which has no "
                    "state_dict()/load_state_dict(); pass an object with both (a model, "
                    "an optimizer, an LR scheduler) or a dict of values and tensors")
        if keep < 0:
            raise ValueError(f"Checkpointer: keep must be >= 0, not {keep}")
        self._session = session
        self._state = state
        # Each rank holds a different part of it (FSDP's DTensors): found once,
        # not on every save.
        self._sharded = _sharded_state(state)
        self._directory = directory or ""
        self._keep = keep
        self.restore_s = 0.0  #: seconds the last restore() took
        self.final_step = 0  #: the run's last step, whose save is never overlapped (0: unknown)
        self._saved_once = False
        self._pending = None  # an overlapped save: (its future, its step)
        self._copier = None
        self._hooked = set()
        self.last_stall_s = 0.0  #: seconds the last save() blocked
        self.last_restore_summary = ""  #: e.g. "step 42 from T0 x2", "fresh start"

    @property
    def directory(self) -> str:
        """Where durable checkpoints go without node memory; "" for none."""
        return self._session.checkpoint_dir or self._directory

    # ---- save ----

    def _collect(self, next_step: int, updated_by_step=frozenset()):
        """(meta, refs, keep_alive) of the state now. A tensor whose bytes
        refs would name in place is cloned unless its address is in
        `updated_by_step` (an overlapped save: those change only in an
        optimizer's step, which waits for the copy)."""
        flat = _Flattener()
        tree = {}
        for key, obj in self._state.items():
            sd = obj if isinstance(obj, Mapping) else obj.state_dict()
            tree[key] = flat.encode(sd, (key,))
        refs, keep_alive = [], []
        for name, t in flat.tensors:
            c = t.detach()
            if c.device.type != "cpu":
                c = c.cpu()
            if not c.is_contiguous():
                c = c.contiguous()
            if updated_by_step and c.data_ptr() == t.data_ptr() and \
                    c.data_ptr() not in updated_by_step:
                c = c.clone()  # a buffer, an RNG state: it may change before the copy ends
            keep_alive.append(c)
            refs.append((name, _DTYPES[c.dtype], list(c.shape), c.data_ptr(),
                         c.numel() * c.element_size()))
        meta = {"format": _FORMAT, "next_step": next_step,
                "python_tree": json.dumps(tree, allow_nan=False)}
        if flat.offsets:
            # Sharded: this rank's blocks of the DTensors, each with where it
            # begins in the global tensor.
            meta["offsets"] = flat.offsets
        return meta, refs, keep_alive

    def save(self, next_step: int) -> bool:
        """Saves the state as it is after `next_step` steps, so that a later
        ``restore()`` returns `next_step`. Returns whether this rank saved
        (without node memory only rank 0 writes; False also when the agent
        held the slot for 30 s). Raises ValueError when the state does not
        fit node memory (the message names the job-spec key to raise) and
        OSError when it cannot be written."""
        if next_step < 1:
            raise ValueError(f"Checkpointer.save: next_step must be >= 1, not {next_step}")
        start = time.monotonic()
        self.wait()
        world, rank, _ = _dist()
        if self._overlaps(next_step):
            return self._save_behind(next_step, world, rank, start)
        writes = self._session.memory_checkpoints or (bool(self.directory) and rank == 0)
        # The rank that writes is in the phase "checkpoint" meanwhile, so
        # that the agent does not time a long save as a step (an
        # endure.Session; the raw binding has no phase scopes).
        wrapper = hasattr(self._session, "_note_checkpoint")
        scope = self._session.phase("checkpoint") if writes and wrapper else _NoScope()
        with scope:
            saved = self._save(next_step, world, rank)
        self.last_stall_s = time.monotonic() - start
        if hasattr(self._session, "_note_checkpoint"):
            self._session._note_checkpoint(self.last_stall_s, next_step if saved else -1)
        self._saved_once = self._saved_once or bool(saved)
        return bool(saved)

    # ---- an overlapped save (node memory, torch >= 2.0) ----
    #
    # The copy into node memory runs on a thread of its own (the copy
    # releases the GIL) while the program goes on with its next step; the
    # optimizers in the state wait for it before they update (a step
    # pre-hook), since the parameters and their optimizer state are copied
    # in place. Every other tensor (buffers, which a forward pass may change,
    # RNG states, the plain dicts' tensors) is cloned first. The first save
    # runs in the foreground (it checks that the state fits the slot), and
    # so do the run's last and every save of a sharded state.

    def wait(self) -> None:
        """Waits for an overlapped save to end (raising its error): its
        time is checkpoint stall, and its step is reported committed."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        future, next_step = pending
        start = time.monotonic()
        try:
            saved = future.result()
        finally:
            waited = time.monotonic() - start
            self.last_stall_s += waited
            if hasattr(self._session, "_note_checkpoint"):
                self._session._note_checkpoint(waited, -1)
        if saved and hasattr(self._session, "_note_checkpoint"):
            self._session._note_checkpoint(0.0, next_step)

    def _overlaps(self, next_step: int) -> bool:
        if not (self._saved_once and self._session.memory_checkpoints):
            return False
        # A sharded state rejoins from what every rank holds in node memory:
        # a copy a kill cut short would cost a second step.
        if self._sharded:
            return False
        # The run's last save ends in the foreground: no next step reports it.
        final = self.final_step or getattr(self._session, "_total_steps", 0)
        if final and next_step >= final:
            return False
        optimizers = [o for o in self._state.values() if isinstance(o, torch.optim.Optimizer)]
        if not optimizers or not all(hasattr(o, "register_step_pre_hook") for o in optimizers):
            return False  # torch 1.x: nothing would wait for the copy
        for o in optimizers:
            if id(o) not in self._hooked:
                o.register_step_pre_hook(lambda *_: self.wait())
                self._hooked.add(id(o))
        return True

    def _updated_by_step(self) -> frozenset:
        """The addresses of the tensors the state's optimizers update in
        their step: the parameters and their state (a DTensor's block)."""
        addresses = set()
        for o in self._state.values():
            if not isinstance(o, torch.optim.Optimizer):
                continue
            for group in o.param_groups:
                for p in group["params"]:
                    addresses.add(_local(p).data_ptr())
            for per_param in o.state.values():
                for v in per_param.values():
                    if isinstance(v, torch.Tensor):
                        addresses.add(_local(v).data_ptr())
        return frozenset(addresses)

    def _save_behind(self, next_step: int, world: int, rank: int, start: float) -> bool:
        meta, refs, keep_alive = self._collect(next_step, self._updated_by_step())
        if "offsets" in meta:
            mine = refs
        else:
            owner = _endure.partition_by_size([r[4] for r in refs], world)
            mine = [r for r, o in zip(refs, owner) if o == rank]
        impl, meta_json = self._session._impl, json.dumps(meta)

        def copy():
            try:
                return impl.save_snapshot(next_step, world, meta_json, mine)
            finally:
                del keep_alive[:]
        if self._copier is None:
            import concurrent.futures
            self._copier = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="endure-checkpoint")
        self._pending = (self._copier.submit(copy), next_step)
        self.last_stall_s = time.monotonic() - start
        if hasattr(self._session, "_note_checkpoint"):
            self._session._note_checkpoint(self.last_stall_s, -1)
        return True

    def _save(self, next_step: int, world: int, rank: int) -> bool:
        meta, refs, keep_alive = self._collect(next_step)
        if self._session.memory_checkpoints:
            if "offsets" in meta:
                mine = refs  # each rank holds a different part: all of it is its shard
            else:
                owner = _endure.partition_by_size([r[4] for r in refs], world)
                mine = [r for r, o in zip(refs, owner) if o == rank]
            saved = self._session._impl.save_snapshot(next_step, world, json.dumps(meta), mine)
        elif "offsets" in meta:
            raise ValueError("Checkpointer.save: a sharded (FSDP) state is saved through node "
                             "memory, each rank its shard; run under endure with [checkpoint] "
                             "every_steps (a directory holds one replica's state, from rank 0)")
        elif self.directory:
            saved = rank == 0  # data-parallel replicas are identical
            if saved:
                _endure.commit_checkpoint(self.directory, next_step, json.dumps(meta), refs,
                                          self._keep)
        else:
            raise ValueError("Checkpointer.save: no node memory and no directory; pass "
                             "Checkpointer(..., directory=...) or run under endure with "
                             "[checkpoint] every_steps")
        del keep_alive
        return bool(saved)

    # ---- restore ----

    def restore(self) -> int:
        """Loads the restore point and returns the step index to start from
        (0: fresh start, nothing loaded). Raises endure.DataLossError when the
        copy the agent chose does not verify, ValueError when the checkpoint
        does not fit the state (another model)."""
        self.wait()
        start = time.monotonic()
        plan = self._session.restore_plan
        if plan is not None:
            step = self._restore_plan(plan)
            self.last_restore_summary = plan["summary"]
        else:
            step = self._restore_directory()
        self.restore_s = time.monotonic() - start
        return step

    def _restore_plan(self, plan: dict) -> int:
        if plan["step"] == 0:
            return 0
        world, rank, initialized = _dist()
        if world > 1 and not initialized:
            raise RuntimeError("Checkpointer.restore: WORLD_SIZE > 1 but torch.distributed "
                               "is not initialised; call init_process_group() first")
        sources = plan["sources"]
        # A replicated state is split across the shards: every rank needs
        # every shard. A sharded one saved by as many ranks as there are now
        # needs only its own (unless the live layout differs: the blocks
        # are placed by their offsets either way).
        own = self._sharded and len(sources) == world
        shards = []
        for index, src in enumerate(sources):
            loader, shard = src["loader_rank"], src["shard"]
            needed = not own or shard == rank
            broadcast = world > 1 and not (own and loader == shard)
            data, error = None, None
            if (world == 1 or loader == rank) and (needed or broadcast):
                try:
                    data = self._session._impl.read_restore_shard(index)
                except (OSError, ValueError) as e:
                    error = e  # the other ranks learn it from the broadcast
            if broadcast:
                data = _broadcast_bytes(data, loader)
            if not needed:
                continue
            if error is not None:
                raise error
            if data is None:
                raise _endure.DataLossError(
                    f"restore of {src['description']}: rank {loader} could not read it")
            shard_meta, shard_tensors = _endure.decode_shard_bytearray(data,
                                                                       src["description"])
            del data
            shard_meta = json.loads(shard_meta)
            if shard_meta.get("step") != plan["step"]:
                raise _endure.DataLossError(
                    f"{src['description']}: holds step {shard_meta.get('step')}")
            tensors = {name: _tensor_from(dtype, shape, payload, src["description"])
                       for name, dtype, shape, payload in shard_tensors}
            shards.append((shard, shard_meta, tensors))
        self._load_shards(shards, plan["summary"])
        return plan["step"]

    def _restore_rejoined(self) -> int:
        """The restore of a sharded state (FSDP) in a generation that
        rejoined in place: the newest step that every rank holds, its own
        shard, in its own node's memory (a killed rank's replacement starts
        on its node), else the agent's plan (which knows the memory copies
        only as of the last full restart, and the durable ones). Every rank
        calls it; returns the step."""
        self.wait()
        start = time.monotonic()
        world, rank, _ = _dist()
        plan = self._session.restore_plan
        impl = self._session._impl
        mine = impl.local_snapshot_steps(world) if self._session.memory_checkpoints else []
        step = _common_step(mine, world)
        if step > (plan["step"] if plan is not None else 0):
            data, error = None, None
            try:
                data = impl.read_local_snapshot(step)
            except (OSError, _endure.DataLossError) as e:
                error = e
            if _all_ranks(error is None, world):
                where = f"step {step} from node memory (each rank its own shard)"
                meta, tensors = _endure.decode_shard_bytearray(data, where)
                del data
                shard = (rank, json.loads(meta),
                         {name: _tensor_from(dtype, shape, payload, where)
                          for name, dtype, shape, payload in tensors})
                self._load_shards([shard], where)
                self.last_restore_summary = where
                self.restore_s = time.monotonic() - start
                return step
            if error is not None:
                print(f"endure: rank {rank}: {error}; restoring the plan's step instead",
                      file=sys.stderr, flush=True)
        if plan is None:
            raise _endure.DataLossError(
                "a sharded state rejoined, and neither every rank's node memory nor a restore "
                "plan holds a step to restore (node-memory checkpoints are needed: [checkpoint] "
                "every_steps)")
        return self.restore()

    def _load_shards(self, shards, where: str) -> None:
        """Loads a checkpoint from its shards read ((shard, meta,
        tensors)): the union of their tensors for a replicated state; for a
        sharded one, the metadata of this rank's shard (else the first read)
        and each DTensor's block made from the blocks of all of them."""
        _, rank, _ = _dist()
        if not shards:
            raise _endure.DataLossError(f"{where}: the plan holds no shard for rank {rank}")
        first = min(shards, key=lambda s: (s[0] != rank, s[0]))
        meta = first[1]
        if "offsets" not in meta:
            merged: Dict[str, torch.Tensor] = {}
            for shard, _, tensors in sorted(shards, key=lambda s: s[0]):
                merged.update(tensors)
            self._load(meta, merged, where)
            return
        offsets = [m.get("offsets") for _, m, _ in shards]
        if not all(isinstance(o, dict) for o in offsets):
            raise ValueError(f"{where}: the checkpoint's shards are not all sharded")
        reshard = _Reshard([(o, t) for o, (_, _, t) in zip(offsets, shards)],
                           _live_mesh(self._state), where)
        self._load(meta, first[2], where, reshard)

    def _restore_directory(self) -> int:
        directory = self.directory
        wanted = self._session.restore_step
        if not directory or wanted == 0:
            return 0
        limit = _INT64_MAX if wanted is None or wanted == -1 else wanted
        world, rank, initialized = _dist()
        loaded, refused = _endure.load_newest_checkpoint(directory, limit)
        step = loaded[0] if loaded else 0
        if world > 1 and initialized:
            # Every rank must start from the step rank 0 found.
            chosen = torch.tensor([step], dtype=torch.int64)
            torch.distributed.broadcast(chosen, 0)
            if int(chosen.item()) != step:
                step = int(chosen.item())
                loaded, refused = _endure.load_newest_checkpoint(directory, step) \
                    if step > 0 else (None, refused)
        if rank == 0:
            for why in refused:
                print(f"endure: checkpoint refused: {why}", flush=True)
        if wanted is not None and wanted != -1 and rank == 0:
            # A rollback ordered by the agent abandons the steps after the
            # restore point: they must never be restored later.
            _endure.remove_checkpoints_after(directory, step)
        if not loaded or step == 0:
            self.last_restore_summary = "fresh start"
            return 0
        step, (meta_json, shard_tensors) = loaded
        tensors = {name: _tensor_from(dtype, shape, payload, directory)
                   for name, dtype, shape, payload in shard_tensors}
        self._load(json.loads(meta_json), tensors, directory)
        self.last_restore_summary = f"step {step} from {directory}"
        return step

    def _load(self, meta: dict, tensors: Dict[str, torch.Tensor], where: str,
              reshard: Optional[_Reshard] = None) -> None:
        if meta.get("format") != _FORMAT or "python_tree" not in meta:
            raise ValueError(f"{where}: not a checkpoint of endure.torch.Checkpointer")
        if self._sharded and reshard is None:
            raise ValueError(f"{where}: the checkpoint holds a replicated state, and this "
                             "state is sharded (FSDP)")
        if reshard is not None and not self._sharded:
            raise ValueError(f"{where}: the checkpoint holds a sharded (FSDP) state, and this "
                             "state is not sharded")
        tree = json.loads(meta["python_tree"])
        missing = [k for k in self._state if k not in tree]
        if missing:
            raise ValueError(f"{where}: the checkpoint has no entry for {', '.join(missing)}")
        for key, obj in self._state.items():
            value = _decode(tree[key], tensors, f"{where}: state[{key!r}]", reshard)
            if isinstance(obj, Mapping):
                obj.clear()
                obj.update(value)
            else:
                obj.load_state_dict(value)


class _NoScope:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _broadcast_bytes(data: Optional[bytearray], root: int) -> Optional[bytearray]:
    """Broadcasts `data` from rank `root` over the default group. None from
    the root (it could not read its copy) is None on every rank."""
    d = torch.distributed
    device = torch.device("cpu")
    if d.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    size = torch.tensor([len(data) if data is not None else -1], dtype=torch.int64,
                        device=device)
    d.broadcast(size, root)
    n = int(size.item())
    if n < 0:
        return None
    if data is None:
        data = bytearray(n)
    buf = torch.frombuffer(data, dtype=torch.uint8) if n > 0 else torch.empty(0,
                                                                             dtype=torch.uint8)
    if device.type == "cpu":
        d.broadcast(buf, root)
    else:
        on_device = buf.to(device)
        d.broadcast(on_device, root)
        buf.copy_(on_device.cpu())
    return data


# ---- In-process recovery: a training loop that survives a peer's failure ----


_ALIGN = 64


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _pack(meta: dict, refs) -> bytearray:
    """The state as one buffer: an 8-byte header length, a JSON header
    (the metadata and each tensor's name, dtype, shape and size), then the
    tensors' bytes in order, each at a multiple of 64 bytes."""
    header = json.dumps({"meta": meta, "tensors": [[n, d, s, b] for n, d, s, _, b in refs]},
                        allow_nan=False).encode()
    offset = _aligned(8 + len(header))
    size = offset + sum(_aligned(r[4]) for r in refs)
    buf = bytearray(size)
    struct.pack_into("<Q", buf, 0, len(header))
    buf[8:8 + len(header)] = header
    base = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
    for _, _, _, address, nbytes in refs:
        ctypes.memmove(base + offset, address, nbytes)
        offset += _aligned(nbytes)
    return buf


def _unpack(buf: bytearray, where: str):
    """(meta, tensors) of a buffer `_pack` made; the tensors are views of it."""
    try:
        (n,) = struct.unpack_from("<Q", buf, 0)
        header = json.loads(bytes(buf[8:8 + n]))
        offset = _aligned(8 + n)
        tensors = {}
        for name, dtype, shape, nbytes in header["tensors"]:
            if dtype not in _TORCH_DTYPES or offset + nbytes > len(buf):
                raise ValueError(f"tensor {name!r}")
            t = torch.empty(shape, dtype=_TORCH_DTYPES[dtype])
            if nbytes:
                t = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes,
                                     offset=offset).view(_TORCH_DTYPES[dtype]).reshape(shape)
            if t.numel() * t.element_size() != nbytes:
                raise ValueError(f"tensor {name!r} has {nbytes} bytes")
            tensors[name] = t
            offset += _aligned(nbytes)
        return header["meta"], tensors
    except (struct.error, ValueError, KeyError, TypeError, RuntimeError) as e:
        raise _endure.DataLossError(f"{where}: malformed state ({e})") from None


class _Rewrapped:
    """What :meth:`Loop.ddp` returns: the module wrapped in
    DistributedDataParallel over the current process group, made anew after
    every rejoin (and the module itself in a world of one)."""

    def __init__(self, loop: "Loop", module, kwargs: dict):
        self.module = module
        self._loop = loop
        self._kwargs = kwargs
        self._ddp = None

    def _current(self):
        if self._ddp is None:
            if self._loop.world_size > 1:
                self._ddp = torch.nn.parallel.DistributedDataParallel(self.module,
                                                                      **self._kwargs)
            else:
                self._ddp = self.module
        return self._ddp

    def __call__(self, *args, **kwargs):
        return self._current()(*args, **kwargs)

    def no_sync(self):
        """DDP's no_sync (gradient accumulation without an allreduce); a
        no-op in a world of one."""
        current = self._current()
        return current.no_sync() if hasattr(current, "no_sync") else _NoScope()

    def __getattr__(self, name):
        return getattr(self._current(), name)


class Loop:
    """A training loop whose processes survive a peer's failure.

    ::

        loop = endure.torch.Loop(session, state, args.steps, directory="ckpt")
        ddp = loop.ddp(model)          # DistributedDataParallel, re-made after a rejoin
        for step in loop:              # restores, then yields the step indices to run
            with loop.guard():         # a failed collective in here is a peer's failure
                ...                    # one step: forward, backward, optimizer.step()

    `state` is what :class:`Checkpointer` takes (model, optimizer, RNG,
    data position); the loop makes one (``loop.checkpointer``) and restores
    through it. It joins the default process group itself (``backend``,
    ``timeout``) when WORLD_SIZE > 1 and the program has not.

    Under an agent with ``[recovery] in_process = true``, a collective that
    fails inside ``guard()`` (a RuntimeError: gloo's "Connection closed by
    peer") is not the end of the process: the loop waits up to
    `rejoin_timeout_s` for the agent's offer of the next generation, abandons
    the broken process group (closing its connections, so that a peer blocked
    on this rank fails in turn), joins the new one (its rank and size may
    differ: a shrink or a regrow), takes the state of the rank that
    completed the most steps (a fresh replacement, or a survivor whose last
    allreduce failed where a peer's succeeded) over the new group, makes the
    DDP wrapper anew and yields the step that failed again. A replacement
    rank started for such a generation takes its state the same way instead
    of from the tiers. When no offer comes (the controller chose another
    route, or the error was the program's own), the error is raised as it
    was. Without an agent (bare, under torchrun) the loop only restores and
    counts steps.

    A step's collectives must come before its update (``optimizer.step()``):
    a step that failed is taken to have changed nothing.
    """

    def __init__(self, session, state: Mapping, total_steps: int, *,
                 directory: Optional[str] = None, keep: int = 3, backend: str = "gloo",
                 timeout: Optional[datetime.timedelta] = None, rejoin_timeout_s: float = 60.0):
        if total_steps < 0:
            raise ValueError(f"Loop: total_steps must be >= 0, not {total_steps}")
        self._build = None if isinstance(state, Mapping) or not callable(state) else state
        self._checkpoint_args = {"directory": directory, "keep": keep}
        if self._build is None:
            self.checkpointer = Checkpointer(session, state, **self._checkpoint_args)
            self.checkpointer.final_step = int(total_steps)
        self.state = state  #: the state; for a function, what it built last
        self.total_steps = int(total_steps)
        self.completed = 0  #: steps whose update this rank applied
        self.start_step = 0  #: the step the loop started from (restored)
        self.rejoins = 0  #: generations joined in place
        self._session = session
        self._backend = backend
        self._timeout = timeout or datetime.timedelta(minutes=30)
        self._rejoin_timeout_s = float(rejoin_timeout_s)
        self._rejoins = bool(getattr(session, "rejoin_offered_here", False))
        self._wrapped: List[_Rewrapped] = []
        self._exact: List["ExactGradients"] = []
        self._failure: Optional[BaseException] = None
        self._started = False
        self._in_step = False
        self.world_size, self.rank, _ = _dist()
        self._connect()
        if self._build is not None:
            self._make_state()
        # Each rank of a sharded state (FSDP) holds a different part of it: a
        # dead rank's part died with it, and only the checkpoint tiers hold
        # it. Such a loop rejoins by building the state anew over the new
        # group and restoring the plan's step into it.
        self._sharded = _sharded_state(self.state)
        why_not = _why_not_in_place(self.state, self._build is not None, session)
        if self._rejoins and why_not:
            print(f"endure: {why_not}, so this program restarts from the checkpoint tiers "
                  "instead of rejoining in place", file=sys.stderr, flush=True)
            self._rejoins = False
        if self._rejoins:
            # From here on, the session's own thread reads the agent's offer
            # file every 10 ms: rejoin_pending() is then cheap enough for
            # every layer and gradient.
            session.declare_rejoin(from_tiers=self._sharded)

    # ---- what the program uses ----

    @property
    def rejoins_in_place(self) -> bool:
        """Whether a peer's failure is survived in this process (the agent
        offers it, and the state is not sharded); otherwise the job restarts
        from the checkpoint tiers, and the report says why."""
        return self._rejoins

    def ddp(self, module, **kwargs) -> _Rewrapped:
        """`module` in DistributedDataParallel (`kwargs` passed on) over the
        current process group, made anew after each rejoin; the module
        itself in a world of one. Use what this returns as the DDP module
        (call it, ``no_sync()``); the optimizer holds ``module``'s
        parameters, which stay the same."""
        proxy = _Rewrapped(self, module, kwargs)
        self._wrapped.append(proxy)
        if self._rejoins:
            self._stop_steps_of(module)
        return proxy

    def slots(self, count: int) -> range:
        """This rank's share of `count` micro-batches (slots) of the global
        batch, split by the current world size: contiguous, the first ranks
        taking one more when they do not divide evenly."""
        base, extra = divmod(int(count), self.world_size)
        first = self.rank * base + min(self.rank, extra)
        return range(first, first + base + (1 if self.rank < extra else 0))

    @property
    def failed(self) -> bool:
        """Whether this step's ``guard()`` caught a failed collective: the
        rest of the step's body (reports, checkpoints) is to be skipped; the
        loop runs the step again after the rejoin."""
        return self._failure is not None

    def exact_gradients(self, parameters) -> "ExactGradients":
        """An :class:`ExactGradients` over `parameters` whose slots are
        dropped whenever a step starts, so that a step that failed part way
        (a peer died) leaves nothing behind for its next attempt."""
        exact = ExactGradients(parameters)
        self._exact.append(exact)
        return exact

    def guard(self) -> "_Guard":
        """The scope of one step's work: a collective that fails inside it
        makes the loop rejoin and yield the step again (see the class)."""
        return _Guard(self)

    def __iter__(self):
        self._start()
        while True:
            if self._rejoins and self._offered_between_steps():
                # Offered between steps, no collective failed: the job
                # changes size (a regrow), or a peer failed while this rank
                # did not wait on it. Then asked again, in the new group, as
                # a rank that starts there asks before its first step.
                self._rejoin("a later generation was offered", None)
                continue
            if self.completed >= self.total_steps:
                return
            step = self.completed
            self._failure = None
            for exact in self._exact:
                exact.discard()
            yield step
            failure, self._failure = self._failure, None
            if failure is None:
                self.completed = step + 1
            else:
                self._rejoin(f"step {step + 1} failed: {_first_line(failure)}", failure)

    # ---- inside ----

    def _stop_steps_of(self, module) -> None:
        # A step whose peer died stops at its next layer (forward) or
        # gradient (backward) once the agent offers the next generation,
        # instead of computing to its end a step that cannot complete.
        for m in module.modules():
            m.register_forward_pre_hook(lambda *_: self._stop_if_offered())
        for p in module.parameters():
            if p.requires_grad:
                p.register_hook(lambda _: self._stop_if_offered())

    def _make_state(self) -> None:
        """Builds the state with the program's function (over the current
        process group) and a checkpointer for it."""
        state = self._build()
        if not isinstance(state, Mapping):
            raise TypeError(f"Loop: the function given as state must return a dict of names "
                            f"to objects, not a {type(state).__name__}")
        self.state = state
        self.checkpointer = Checkpointer(self._session, state, **self._checkpoint_args)
        self.checkpointer.final_step = self.total_steps

    def _offered_between_steps(self) -> bool:
        """Whether to rejoin before the next step. The ranks of a sharded
        state agree on it (a MAX allreduce of what each saw): its modules
        keep the old group's connections open (the program's own frame
        holds them), so a rank that left while a peer had begun the step
        would hold that peer in its first collective for good; for the same
        reason such a loop does not stop a step part way (a dead peer fails
        the step's next collective, FSDP has one per sharded module)."""
        pending = self._session.rejoin_pending()
        if not self._sharded or self.world_size == 1:
            return pending
        flag = torch.tensor([1 if pending else 0], dtype=torch.int64)
        try:
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        except RuntimeError:
            return True  # a peer failed: the offer comes
        return bool(flag.item())

    def _stop_if_offered(self) -> None:
        if self._in_step and self._session.rejoin_pending():
            raise PeerFailed("a later generation was offered while this step ran: a peer failed")

    def _connect(self) -> None:
        d = torch.distributed
        if self.world_size > 1 and not d.is_initialized():
            if self.rank != 0:
                _wait_until_listening(os.environ.get("MASTER_ADDR", "127.0.0.1"),
                                      os.environ.get("MASTER_PORT", ""),
                                      self._timeout.total_seconds())
            d.init_process_group(self._backend, timeout=self._timeout)

    def _start(self) -> None:
        if self._started:
            raise RuntimeError("Loop: iterate over a loop once")
        self._started = True
        start = time.monotonic()
        if self._session.peer_restore and self._sharded:
            # A replacement joining ranks that kept their processes.
            self.completed = self.checkpointer._restore_rejoined()
        elif self._session.peer_restore and self.world_size > 1:
            self.completed = self._join_peers(-1)
        else:
            self.completed = self.checkpointer.restore()
        self.start_step = self.completed
        if self._rejoins and not self._sharded:
            # A rejoin collects the abandoned DDP modules' reference cycles
            # (_abandon); what exists now (torch, the program's modules, the
            # model) lives as long as the process, and is left out of every
            # collection from here on: the rejoin's collection took 0.13 s
            # under torch 2.x with them, most of the rejoin. torch 2.x's
            # first DDP imports torch._dynamo: that goes in too.
            from . import _warm_torch
            _warm_torch()
            gc.freeze()
        for proxy in self._wrapped:
            proxy._current()  # DDP's broadcast from rank 0, now that every rank agrees
        self.checkpointer.restore_s = time.monotonic() - start
        self._session.ready(self.completed, restore_s=self.checkpointer.restore_s)

    def _rejoin(self, why: str, failure: Optional[BaseException]) -> None:
        start = time.monotonic()
        print(f"endure: rank {self.rank}: {why}; rejoining", file=sys.stderr, flush=True)
        try:
            self.checkpointer.wait()  # the state is handed over (or restored) whole
        except (OSError, ValueError) as e:
            print(f"endure: rank {self.rank}: the last checkpoint was not saved: {e}",
                  file=sys.stderr, flush=True)
        while True:
            if not self._session.rejoin(self._rejoin_timeout_s):
                if failure is not None:
                    raise failure
                raise RuntimeError(f"endure: {why}, but no later generation came within "
                                   f"{self._rejoin_timeout_s:g} s")
            if failure is not None:
                # Its frames hold the failed step's DDP, and through it the group.
                failure.__traceback__ = None
                failure = None
            self._abandon()
            self.world_size = int(os.environ.get("WORLD_SIZE") or 1)
            self.rank = int(os.environ.get("RANK") or 0)
            try:
                self._connect()
                if self._sharded:
                    self._rebuild()
                else:
                    self.completed = self._join_peers(self.completed)
                for proxy in self._wrapped:
                    proxy._current()
                break
            except RuntimeError as e:  # another peer failed meanwhile: the next offer
                failure, why = e, f"rejoining failed: {_first_line(e)}"
                print(f"endure: rank {self.rank}: {why}; rejoining", file=sys.stderr,
                      flush=True)
        self.rejoins += 1
        self.checkpointer.restore_s = time.monotonic() - start
        self._session.ready(self.completed, restore_s=self.checkpointer.restore_s)
        if self.rank == 0:
            source = f" ({self.checkpointer.last_restore_summary})" if self._sharded else ""
            print(f"endure: rejoined generation {self._session.generation} at step "
                  f"{self.completed} as rank {self.rank} of {self.world_size} "
                  f"in {self.checkpointer.restore_s:.3f} s{source}", flush=True)

    def _abandon(self) -> None:
        # The old group goes with its last reference (the DDP wrappers hold
        # it too), which closes its connections: a peer still blocked in a
        # collective with this rank (in a ring, it waits on this rank, not
        # on the dead one) sees them close, and rejoins in turn. This rank's
        # own collectives on it have ended (failed, or none was in flight).
        d = torch.distributed
        for proxy in self._wrapped:
            proxy._ddp = None
        if d.is_initialized():
            _abort_nccl()
            d.destroy_process_group()
        gc.collect()  # DDP modules sit in reference cycles (the rest is frozen: _start)

    def _rebuild(self) -> None:
        """A sharded state after a rejoin: the old one (its modules hold the
        abandoned group) goes, the program's function builds it anew over
        the new group, and every rank restores the restore plan's step into
        it (a rank that kept a later step goes back to it: the tiers hold
        no later one of the dead rank's part)."""
        self.checkpointer.wait()
        self.state = self.checkpointer = None
        gc.collect()
        self._make_state()
        self.completed = self.checkpointer._restore_rejoined()

    def _join_peers(self, completed: int) -> int:
        """Every rank says how many steps it completed (-1: it starts fresh);
        the lowest rank that completed the most sends its state to the ranks
        behind. Returns the steps completed, now the same everywhere."""
        if self.world_size == 1:
            if completed < 0:
                raise _endure.DataLossError("no rank of the new generation holds the state")
            return completed
        d = torch.distributed
        mine = torch.tensor([completed], dtype=torch.int64)
        every = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        d.all_gather(every, mine)
        steps = [int(t.item()) for t in every]
        best = max(steps)
        if best < 0:
            raise _endure.DataLossError("no rank of the new generation holds the state")
        if all(s == best for s in steps):
            return best
        source = steps.index(best)
        data = None
        if self.rank == source:
            meta, refs, keep_alive = self.checkpointer._collect(best)
            data = _pack(meta, refs)
            del keep_alive
        data = _broadcast_bytes(data, source)
        if completed != best:
            where = f"the state of step {best} from rank {source}"
            meta, tensors = _unpack(data, where)
            self.checkpointer._load(meta, tensors, where)
            self.checkpointer.last_restore_summary = \
                f"step {best} from a data-parallel peer (rank {source})"
        return best


def _why_not_in_place(state: Mapping, built: bool, session) -> str:
    """Why a loop over `state` cannot survive a peer's failure in its
    process ("" when it can): FSDP's FullyShardedDataParallel (its state is
    not DTensors), or a sharded state (fully_shard) that the program passed
    built (the loop must build it anew over the new group) or that has no
    node-memory checkpoints to restore a dead rank's part from."""
    for name, value in state.items():
        if not isinstance(value, torch.nn.Module):
            continue
        for m in value.modules():
            if "FullyShardedDataParallel" in {k.__name__ for k in type(m).__mro__}:
                return (f"state[{name!r}] is sharded by FullyShardedDataParallel: a failed "
                        "rank's shard is lost with it (use fully_shard, and give the loop a "
                        "function that builds the state)")
    if not _sharded_state(state):
        return ""
    if not built:
        return ("the state is sharded (FSDP): pass a function that builds it as Loop's state, "
                "so that the loop can build it anew over the next generation's group")
    if not session.memory_checkpoints:
        return ("the state is sharded (FSDP) and has no node-memory checkpoints ([checkpoint] "
                "every_steps, memory) to restore a failed rank's part from")
    return ""


def _abort_nccl() -> None:
    """Aborts the NCCL communicators of every process group (ncclCommAbort,
    where the PyTorch version has it: ProcessGroupNCCL.abort, or _shutdown
    before 2.6) before the groups are destroyed: NCCL does not fail a
    collective whose peer died, it stays queued on the GPU stream (the step
    was stopped by the loop's hooks), and destroying the group would wait for
    it. Gloo's groups need nothing: destroying them closes their sockets.
    Untested here (no GPU); NVIDIA resiliency-ext aborts the same way."""
    if not torch.cuda.is_available():
        return
    c10d = torch.distributed.distributed_c10d
    for group in list(getattr(getattr(c10d, "_world", None), "pg_names", {})):
        try:
            backend = group._get_backend(torch.device("cuda"))
        except (RuntimeError, AttributeError):
            continue
        if type(backend).__name__ != "ProcessGroupNCCL":
            continue
        abort = getattr(backend, "abort", None) or getattr(backend, "_shutdown", None)
        if abort is not None:
            abort()


class ExactGradients:
    """Gradient sums that do not depend on the world size, for a job that
    shrinks and grows back and must train the parameters bit for bit as a
    run that never did (endure-train's arithmetic, src/trainer/exact_sum.h).

    The global batch is a fixed number of slots (micro-batches); each rank
    computes its share (:meth:`Loop.slots`), with each slot's loss divided by
    the number of slots, and calls :meth:`take_slot` after each slot's
    backward. :meth:`reduce` then sums every rank's slots into each
    parameter's ``.grad``: each slot's gradient is rounded once to a 64-bit
    integer at a scale shared by every rank (2^s from the largest magnitude,
    agreed by a MAX allreduce), and integers add exactly in any order and
    grouping, so neither the partition of the slots among the ranks nor the
    allreduce's order can change a bit. Use the model itself, not DDP, with
    it; it keeps one copy of the gradients per slot a rank computes.
    """

    def __init__(self, parameters):
        self._params = list(parameters)
        self._slots: List[List[torch.Tensor]] = []

    def discard(self) -> None:
        """Drops the slots taken so far (a step that failed part way: the
        loop calls it before each step of the ones it made)."""
        self._slots = []

    def take_slot(self) -> None:
        """The backward pass of one of this rank's slots is done: keeps its
        gradients and clears the parameters' for the next slot."""
        grads = []
        for p in self._params:
            grads.append(p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
            p.grad = None
        self._slots.append(grads)

    def reduce(self, total_slots: int) -> None:
        """Sums the slots taken on every rank of the default process group
        (`total_slots` of them in all) into the parameters' ``.grad``."""
        slots, self._slots = self._slots, []
        if not slots:
            raise RuntimeError("ExactGradients.reduce: no slot taken on this rank")
        d = torch.distributed
        grouped = d.is_available() and d.is_initialized() and d.get_world_size() > 1
        maxes = torch.zeros(len(self._params), dtype=torch.float32)
        for grads in slots:
            for i, g in enumerate(grads):
                m = g.abs().max() if g.numel() else torch.tensor(0.0)
                maxes[i] = torch.maximum(maxes[i], m) if torch.isfinite(m) else math.inf
        if grouped:
            d.all_reduce(maxes, op=d.ReduceOp.MAX)
        t = max(0, math.ceil(math.log2(total_slots)))
        exponents = []
        for m in maxes.tolist():
            if not math.isfinite(m):
                exponents.append(None)  # a NaN or an infinity: the sum is not finite
            elif m == 0:
                exponents.append(0)
            else:
                exponents.append(61 - math.frexp(m)[1] - t)
        sums = []
        for i, p in enumerate(self._params):
            e = exponents[i]
            if e is None:
                sums.append(torch.full(p.shape, math.nan, dtype=torch.float64).reshape(-1))
                continue
            acc = torch.zeros(p.numel(), dtype=torch.int64)
            for grads in slots:
                # A power of two times a float is exact in a double; round()
                # (to nearest, ties to even) does the only rounding.
                acc += torch.round(grads[i].double().reshape(-1) * (2.0 ** e)).to(torch.int64)
            sums.append(acc)
        finite = [i for i, e in enumerate(exponents) if e is not None]
        if grouped and finite:
            flat = torch.cat([sums[i] for i in finite])
            d.all_reduce(flat, op=d.ReduceOp.SUM)
            offset = 0
            for i in finite:
                n = sums[i].numel()
                sums[i] = flat[offset:offset + n]
                offset += n
        for i, p in enumerate(self._params):
            e = exponents[i]
            value = sums[i] if e is None else sums[i].double() * (2.0 ** -e)
            p.grad = value.to(p.dtype).reshape(p.shape)


class PeerFailed(RuntimeError):
    """Raised inside a step (from a hook on the module given to
    :meth:`Loop.ddp`) when the agent offers a later generation while the step
    runs: a peer failed, and the step cannot complete."""


class _Guard:
    def __init__(self, loop: Loop):
        self._loop = loop

    def __enter__(self):
        self._loop._in_step = True
        return self

    def __exit__(self, kind, value, traceback):
        self._loop._in_step = False
        # Only a RuntimeError (what gloo, NCCL and torch.distributed raise for
        # a broken collective) may be a peer's failure; the loop waits for
        # the agent's word before it takes it for one.
        if value is None or not self._loop._rejoins or not isinstance(value, RuntimeError):
            return False
        self._loop._failure = value
        return True


def _wait_until_listening(host: str, port: str, timeout_s: float) -> None:
    """Waits until rank 0's store accepts connections (5 ms apart): a
    TCPStore client that connects too early backs off for a second."""
    import socket
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, int(port)), timeout=1.0).close()
            return
        except (OSError, ValueError):
            time.sleep(0.005)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__
