"""DataLoader batches' bytes through reusable shared memory instead of the worker's result pipe.

A worker copies the ``bytes`` lists and small CPU tensors of a collated batch (a dict; or the ``bytes`` values
of a batch that is a list of sample dicts, as ``collate_fn=list`` makes) into one of a few
*slots*: files in ``/dev/shm`` it created once and keeps mapped. It sends only a small description (slot
path, sizes). The training process maps each slot once (and unlinks its name then, so nothing is left
behind), copies the values out and marks the slot free in its first byte; the worker reuses free slots.
Compared with pickling through the pipe (a copy into the pickle, into the pipe, out of it, out of the
pickle, 64 KiB at a time) this is one copy in and one copy out, into memory that stays mapped, and no file
descriptor passing per tensor. When no slot is free (the training process is slow to take batches) the
batch is sent the ordinary way: slots bound the memory, ``slots x slot size`` per worker.

Slots are reserved (:mod:`fastload.train.shmfiles`), so a small /dev/shm (Docker's 64 MiB) fails when a
slot is made, never with SIGBUS: a worker then makes fewer and smaller slots, and when none fits (or all are
busy) sends tensors *inline*, as bytes through its pipe, with no shared memory at all (torch's own path
would put each tensor in /dev/shm); one warning per worker says what was free, needed and what to change.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import warnings
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fastload.train.shmfiles import (
    SHM_DIR,
    create_slot,
    owner,
    remove_dead,
    shm_free_bytes,
    sweep_stale,
    unlink_matching,
)

SLOTS = 6
MIN_SLOT_BYTES = 8 << 20
HEADER = 64  # byte 0: 0 free; 1 sent, not taken yet; 2 taken, views of it still held (leased)
SMALL_TENSOR_BYTES = 64 << 10  # tensors up to this size are copied out; bigger ones handed out as views
ALIGN = 64  # where each tensor starts in a slot
SHORT_WARNING = (
    "fastload.DataLoader worker {pid}: /dev/shm has {free:.0f} MiB free, and a batch slot needs {need:.0f} "
    "MiB ({slots} per worker); {what}. Give the job more shared memory (docker run --shm-size=2g; in "
    "Kubernetes a memory-backed emptyDir at /dev/shm), or use fewer workers or smaller batches."
)


class WorkerSlots:
    """The worker's side: a few reusable slots; :meth:`pack` moves a batch's bulk into one."""

    def __init__(self, slots: int = SLOTS) -> None:
        self.max_slots = slots
        self.pid = os.getpid()
        self.token = secrets.token_hex(4)  # tells this process's files from another namespace's same pid
        self.slots: list[tuple[str, mmap.mmap]] = []
        self._fds: list[int] = []  # held open, each with an flock: the slot's owner is alive
        self._sent: dict[str, int] = {}  # slot path -> number of the batch last packed into it
        self._count = 0
        self.short = False  # /dev/shm could not hold a slot: batches that find none free go inline
        self._warned = False

    def pack(
        self, batch: Any, stacks: dict[str, list[torch.Tensor]] | None = None
    ) -> tuple[Any, dict[str, Any] | None]:
        """``(rest of the batch, description)``; the description is None when the batch went unchanged.
        ``stacks``: fields not collated yet, each a list of same-shape tensors (:func:`stackable`), to be
        stacked straight into the slot; when no slot is free they are stacked the ordinary way."""
        if isinstance(batch, list) and batch and all(type(x) is dict for x in batch):
            return self._pack_samples(batch)
        if not isinstance(batch, dict):
            return batch, None
        stacks = stacks or {}
        parts: dict[str, list[Any]] = {}
        for k, v in batch.items():
            if isinstance(v, list) and v and all(type(x) is bytes for x in v):
                parts[k] = v
            elif _plain(v) and v.is_contiguous():
                parts[k] = [v]
        shapes = {k: [len(v), *v[0].shape] for k, v in stacks.items()}
        total = sum(len(x) for v in parts.values() if type(v[0]) is bytes for x in v)
        total += sum(
            ALIGN + v[0].numel() * v[0].element_size() for v in parts.values() if type(v[0]) is not bytes
        )
        total += sum(ALIGN + len(v) * v[0].numel() * v[0].element_size() for v in stacks.values())
        slot = self._free(total) if total else None
        if slot is None:
            if stacks:
                batch = {k: torch.stack(stacks[k]) if k in stacks else v for k, v in batch.items()}
            if self.short:
                return _inline(batch)
            return batch, None
        path, mm = slot
        view = memoryview(mm)
        pos = HEADER
        layout: dict[str, Any] = {}
        for k in [k for k in batch if k in parts or k in stacks]:
            values: list[Any] = parts.get(k) or stacks[k]
            if type(values[0]) is bytes:
                sizes = []
                for x in values:
                    view[pos : pos + len(x)] = x
                    pos += len(x)
                    sizes.append(len(x))
                layout[k] = {"sizes": sizes}
                continue
            pos = -(-pos // ALIGN) * ALIGN
            t = values[0]
            shape = shapes[k] if k in stacks else list(t.shape)
            n = t.element_size() * int(np.prod(shape))
            if n:
                out = torch.frombuffer(view, dtype=torch.uint8, count=n, offset=pos)
                if k in stacks:
                    torch.stack(values, out=out.view(t.dtype).view(shape))
                else:
                    out.copy_(t.reshape(-1).view(torch.uint8))
                del out  # (it holds the view)
            layout[k] = {"tensor": (str(t.dtype).removeprefix("torch."), shape, n), "at": pos}
            pos += n
        view.release()
        mm[0] = 1
        self._count += 1
        self._sent[path] = self._count
        rest = {k: v for k, v in batch.items() if k not in parts and k not in stacks}
        return rest, {"path": path, "pid": self.pid, "layout": layout, "order": list(batch)}

    def _pack_samples(self, batch: list[dict[str, Any]]) -> tuple[Any, dict[str, Any] | None]:
        """A batch that is a list of sample dicts (``collate_fn=list``): its ``bytes`` values into a slot."""
        total = sum(len(v) for sample in batch for v in sample.values() if type(v) is bytes)
        slot = self._free(total) if total else None
        if slot is None:
            return batch, None
        path, mm = slot
        view = memoryview(mm)
        pos = HEADER
        rest: list[dict[str, Any]] = []
        layout: list[list[tuple[str, int]]] = []  # per sample: (field, size) of each value in the slot
        for sample in batch:
            kept: dict[str, Any] = {}
            sizes: list[tuple[str, int]] = []
            for k, v in sample.items():
                if type(v) is bytes:
                    view[pos : pos + len(v)] = v
                    pos += len(v)
                    sizes.append((k, len(v)))
                else:
                    kept[k] = v
            rest.append(kept)
            layout.append(sizes)
        view.release()
        mm[0] = 1
        self._count += 1
        self._sent[path] = self._count
        orders = [list(sample) for sample in batch]
        return rest, {"path": path, "pid": self.pid, "samples": layout, "orders": orders}

    def _free(self, total: int) -> tuple[str, mmap.mmap] | None:
        # The training process takes each worker's batches in order (fastload.DataLoader needs
        # in_order=True), so a slot still busy while a slot packed after it is free again holds a batch
        # that was discarded (an iteration abandoned with persistent workers): it is free too.
        # A leased slot (2) was taken: it counts as "taken after" but is never reused while leased.
        freed = max((self._sent.get(p, 0) for p, mm in self.slots if mm[0] != 1), default=0)
        for path, mm in self.slots:
            state = mm[0]
            if (state == 0 or (state == 1 and self._sent.get(path, 0) < freed)) and len(mm) >= HEADER + total:
                return path, mm
        if len(self.slots) >= self.max_slots:
            return None
        want = max(MIN_SLOT_BYTES, 2 * (HEADER + total))
        for size in dict.fromkeys((want, HEADER + total)):  # the usual size, else just what this batch needs
            made = create_slot(self.pid, self.token, size)
            if made is not None:
                self._fds.append(made[2])
                if size != want:
                    self._short(
                        want, f"it uses slots of {size / 2**20:.0f} MiB, {len(self.slots) + 1} at most"
                    )
                    self.max_slots = len(self.slots) + 1
                self.slots.append(made[:2])
                return made[:2]
            if not os.path.isdir(SHM_DIR):  # no /dev/shm here (not Linux): batches go the ordinary way
                self.max_slots = len(self.slots)
                return None
        self.max_slots = len(self.slots)
        what = (
            f"it keeps its {len(self.slots)} slot(s) and sends batches that find none free through its pipe"
            if self.slots
            else "it sends batches through its pipe without shared memory (slower)"
        )
        self._short(want, what)
        return None

    def _short(self, need: int, what: str) -> None:
        self.short = True
        if not self._warned:
            self._warned = True
            free = shm_free_bytes() / 2**20
            text = SHORT_WARNING.format(pid=self.pid, free=free, need=need / 2**20, slots=SLOTS, what=what)
            warnings.warn(text, UserWarning, stacklevel=4)


def _inline(batch: Any) -> tuple[Any, dict[str, Any] | None]:
    """A dict batch with its plain tensors as bytes (dtype, shape, data): what goes through the worker's pipe
    when /dev/shm is short, since torch would put each tensor in /dev/shm to send it."""
    if not isinstance(batch, dict):
        return batch, None
    tensors = {
        k: (
            str(v.dtype).removeprefix("torch."),
            list(v.shape),
            v.contiguous().view(-1).view(torch.uint8).numpy().tobytes(),
        )
        for k, v in batch.items()
        if _plain(v)
    }
    if not tensors:
        return batch, None
    rest = {k: v for k, v in batch.items() if k not in tensors}
    return rest, {"inline": tensors, "order": list(batch)}


def _as_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


class MainSlots:
    """The training process's side: maps slots on first sight (and unlinks their names then), copies batches
    out, frees the slots. :meth:`close` unmaps them and removes the names its workers left unmapped (a
    batch abandoned in flight); slot files of processes that no longer exist are removed on creation."""

    def __init__(self, *, pin_memory: bool = False) -> None:
        self.maps: dict[str, mmap.mmap] = {}
        self.owners: set[str] = set()  # "<pid>-<token>" of the workers whose slots were seen
        self.children: set[int] = set()  # worker pids (watch_children)
        self.pin_memory = pin_memory  # tensors rebuilt here are pinned as DataLoader's pin_memory would
        sweep_stale()

    def unpack(self, rest: Any, description: dict[str, Any]) -> Any:
        """The batch as the worker's collate made it (a dict, or a list of sample dicts)."""
        if "inline" in description:
            return self._unpack_inline(rest, description)
        mm = self._map(description)
        if "samples" in description:
            return self._unpack_samples(mm, rest, description)
        view = memoryview(mm)
        pos = HEADER
        values: dict[str, Any] = {}
        leased: np.ndarray | None = None  # the slot as an array, while views of it are handed out
        for k, spec in description["layout"].items():
            if "sizes" in spec:
                out = values[k] = []
                for n in spec["sizes"]:
                    out.append(bytes(view[pos : pos + n]))
                    pos += n
                continue
            name, shape, n = spec["tensor"]
            pos = spec.get("at", pos)
            dtype = getattr(torch, name)
            if not n:
                tensor = torch.empty(shape, dtype=dtype)
            elif n <= SMALL_TENSOR_BYTES or self.pin_memory:  # copied out (pinned: the copy is the pinning)
                tensor = (
                    torch.frombuffer(view, dtype=torch.uint8, count=n, offset=pos).view(dtype).view(shape)
                )
                tensor = tensor.pin_memory() if self.pin_memory else tensor.clone()
            else:
                if leased is None:
                    leased = np.frombuffer(mm, dtype=np.uint8)
                tensor = torch.from_numpy(leased[pos : pos + n]).view(dtype).view(shape)
            values[k] = tensor
            pos += n
        view.release()
        if leased is None:
            mm[0] = 0  # copied out: the worker may reuse the slot
        else:  # free when the last view is gone
            mm[0] = 2
            weakref.finalize(leased, _release, mm)
        return {k: values[k] if k in values else rest[k] for k in description["order"]}

    def watch_children(self) -> None:
        """Note this process's child processes (DataLoader workers just started), so that the slot files of
        one that dies can be removed (:meth:`remove_dead_children`)."""
        import multiprocessing

        self.children.update(p.pid for p in multiprocessing.active_children() if p.pid is not None)

    def remove_dead_children(self) -> None:
        """Remove the unsent slot files of watched workers that are gone (e.g. killed); those are no longer
        watched (a pid may be reused)."""
        self.children = self.children - remove_dead(self.children)  # (rebound: a SIGCHLD may call this)

    def _unpack_inline(self, rest: dict[str, Any], description: dict[str, Any]) -> dict[str, Any]:
        values = {}
        for k, (name, shape, data) in description["inline"].items():
            tensor = (
                torch.frombuffer(bytearray(data), dtype=torch.uint8)
                if data
                else torch.empty(0, dtype=torch.uint8)
            )
            tensor = tensor.view(getattr(torch, name)).view(shape)
            values[k] = tensor.pin_memory() if self.pin_memory else tensor
        return {k: values[k] if k in values else rest[k] for k in description["order"]}

    def _map(self, description: dict[str, Any]) -> mmap.mmap:
        mm = self.maps.get(description["path"])
        if mm is None:
            self.owners.add(owner(os.path.basename(description["path"])))
            fd = os.open(description["path"], os.O_RDWR)
            try:
                mm = self.maps[description["path"]] = mmap.mmap(fd, 0)
            finally:
                os.close(fd)
                os.unlink(description["path"])  # mapped on both sides now; nothing to leave behind
        return mm

    def _unpack_samples(
        self, mm: mmap.mmap, rest: list[dict[str, Any]], description: dict[str, Any]
    ) -> list[dict[str, Any]]:
        view = memoryview(mm)
        pos = HEADER
        out = []
        for kept, sizes, order in zip(rest, description["samples"], description["orders"], strict=True):
            values = {}
            for k, n in sizes:
                values[k] = bytes(view[pos : pos + n])
                pos += n
            out.append({k: values[k] if k in values else kept[k] for k in order})
        view.release()
        mm[0] = 0
        return out

    def close(self) -> None:
        for mm in self.maps.values():
            with contextlib.suppress(BufferError):  # views still held: unmapped when the last one goes
                mm.close()
        self.maps.clear()
        owners, self.owners = self.owners, set()
        if owners:
            unlink_matching(lambda name: owner(name) in owners)

    def __del__(self) -> None:
        self.close()


def _release(mm: mmap.mmap) -> None:
    with contextlib.suppress(ValueError):  # (already closed)
        mm[0] = 0


def _plain(v: Any) -> bool:
    """Whether ``v`` is a tensor that a slot can carry as bytes and give back as it was: a plain (not a
    subclass) dense CPU tensor, not tracking gradients, without a lazy conjugate or negation."""
    return (
        type(v) is torch.Tensor
        and v.layout == torch.strided
        and v.device.type == "cpu"
        and not (v.is_quantized or v.requires_grad or v.is_conj() or v.is_neg())
    )


def stackable(samples: Sequence[Any]) -> list[str]:
    """Fields of dict samples that the default collate would stack into one big tensor: every sample's value
    a CPU tensor of the same shape and dtype, together over ``SMALL_TENSOR_BYTES``."""
    if not samples or not all(type(s) is dict for s in samples):
        return []
    first = samples[0]
    out = []
    for k, v in first.items():
        if not _plain(v):
            continue
        if len(samples) * v.numel() * v.element_size() <= SMALL_TENSOR_BYTES:
            continue
        if all(
            type(x := s.get(k)) is type(v)
            and x.shape == v.shape
            and x.dtype == v.dtype
            and x.device == v.device
            for s in samples
        ):
            out.append(k)
    return out


_worker: WorkerSlots | None = None


def worker_slots() -> WorkerSlots:
    """This worker process's slots (made on first use, so forked and spawned workers each get their own).
    A worker leaves its slot files in place when it exits: batches it sent may still wait in the training
    process, which unlinks each name when it maps it (or in :meth:`MainSlots.close`)."""
    global _worker
    if _worker is None or _worker.pid != os.getpid():
        _worker = WorkerSlots()
    return _worker
