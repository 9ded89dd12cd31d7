"""Shared memory in hostile places (issue 16): a small /dev/shm as Docker gives (64 MiB, and 8 MiB) must
never kill workers with SIGBUS, and a /dev/shm shared across PID namespaces must never lose another job's
live slot files to the stale-file sweep. Each runs in its own mount (and PID) namespace: root and
``unshare`` needed, else skipped."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import fastload
from fastload.train import shmfiles

ROOT = Path(__file__).resolve().parents[2]


def _can_unshare(*flags: str) -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", *flags, "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


needs_mount_ns = pytest.mark.skipif(not _can_unshare("-m"), reason="needs root and unshare -m")
needs_pid_ns = pytest.mark.skipif(not _can_unshare("-p", "-f"), reason="needs root and unshare -p")

READER = textwrap.dedent(
    """
    import sys, torch, fastload
    def to_tensor(s):  # 4 MiB per sample, its value from the sample: batches of 4 are 16 MiB
        return {"x": torch.full((4096, 1024), int(s["txt"]) % 251, dtype=torch.uint8), "k": s["__key__"]}
    ds = fastload.ShardDataset(sys.argv[1], decode=False, map=to_tensor)
    seen = []
    for b in fastload.DataLoader(ds, batch_size=4, num_workers=2):
        assert b["x"].shape == (len(b["k"]), 4096, 1024), b["x"].shape
        for x, k in zip(b["x"], b["k"]):
            assert bool((x == int(k) % 251).all()), k
        seen += b["k"]
    assert sorted(seen) == [f"{i:03d}" for i in range(48)], seen
    print("OK", len(seen))
    """
)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("shm-src")
    for i in range(48):
        (src / f"{i:03d}.txt").write_text(str(i))
    out = tmp_path_factory.mktemp("shm-ds") / "ds"
    fastload.pack(str(src), str(out), progress=False, max_samples=12)
    return out


@needs_mount_ns
@pytest.mark.parametrize("size", ["8m", "64m"])
def test_small_dev_shm_falls_back_with_one_warning_instead_of_sigbus(dataset: Path, size: str) -> None:
    script = f"mount -t tmpfs -o size={size} tmpfs /dev/shm && exec {sys.executable} -c '{READER}' {dataset}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OK 48" in proc.stdout
    assert "exited unexpectedly" not in proc.stderr and "Bus error" not in proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "/dev/shm has" in line]
    assert 1 <= len(warned) <= 2, proc.stderr[-3000:]  # one per worker at most
    assert "--shm-size" in warned[0] and "MiB free" in warned[0] and "fewer workers" in warned[0]


HOLDER = textwrap.dedent(
    """
    import multiprocessing as mp, sys
    def hold(conn):  # pid 2 (or more) of its namespace: a worker holding a slot
        from fastload.train import shmbatch
        slots = shmbatch.WorkerSlots(slots=1)
        path, _ = slots._free(100)
        conn.send(path)
        conn.recv()  # until told to go
    if __name__ == "__main__":
        mp.set_start_method("fork")
        a, b = mp.Pipe()
        p = mp.Process(target=hold, args=(b,))
        p.start()
        print(a.recv(), flush=True)
        sys.stdin.readline()
        a.send("go")
        p.join()
    """
)

SWEEPER = textwrap.dedent(
    """
    import os, sys
    pid = int(os.path.basename(sys.argv[1]).split("-")[1])
    try:  # (before importing anything that may start a process of its own here)
        os.kill(pid, 0)
        print("pid visible", pid, os.getpid())
    except ProcessLookupError:
        print("pid not visible")
    from fastload.train import shmfiles  # the sweep WorkerSlots runs (shmbatch re-exports it; no torch)
    shmfiles.sweep_stale(older_than=0)
    print("kept" if os.path.exists(sys.argv[1]) else "removed")
    """
)


@needs_pid_ns
def test_sweep_keeps_live_slots_of_another_pid_namespace() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = ["unshare", "-p", "-f", sys.executable, "-c", HOLDER]
    with subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env) as holder:
        assert holder.stdin is not None and holder.stdout is not None
        path = holder.stdout.readline().strip()
        try:
            assert os.path.basename(path).startswith(shmfiles.PREFIX + "-") and os.path.exists(path)

            def sweep() -> list[str]:
                cmd = ["unshare", "-p", "-f", sys.executable, "-c", SWEEPER, path]
                out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
                assert out.returncode == 0, out.stderr
                return out.stdout.split("\n")

            # the sweeper's namespace cannot see the owner's pid (a pid check would call it dead) ...
            first = sweep()
            assert first[0] == "pid not visible"
            assert first[1] == "kept", "another namespace's live slot file was removed"
            holder.stdin.write("\n")
            holder.stdin.flush()
            assert holder.wait(timeout=60) == 0
            # ... and once its owner is gone, the file is a stale one
            assert sweep()[1] == "removed"
        finally:
            if holder.poll() is None:
                holder.kill()
            if os.path.exists(path):
                os.unlink(path)


KILLED = textwrap.dedent(
    """
    import os, signal, sys, time, torch, fastload
    from fastload.errors import WorkerDiedError
    def big(s):  # tensors big enough to travel through shared-memory slots
        return {"x": torch.zeros(256, 1024, dtype=torch.uint8), "k": s["__key__"]}
    ds = fastload.ShardDataset(sys.argv[1], decode=False, map=big)
    loader = fastload.DataLoader(ds, batch_size=2, num_workers=2, timeout=60)
    it = iter(loader)
    next(it)
    import multiprocessing
    victim = multiprocessing.active_children()[0].pid
    try:  # torch notices from its SIGCHLD handler, maybe before the next batch is asked for
        os.kill(victim, signal.SIGKILL)
        for _ in range(200):
            time.sleep(0.01)  # (a training step)
        for _ in it:
            pass
    except WorkerDiedError as exc:
        print("DIED", victim, exc)
    else:
        print("NO ERROR")
    del it
    left = [n for n in os.listdir("/dev/shm") if n.startswith(f"fastload-{victim}-")]
    print("LEFT", left)
    """
)


@pytest.mark.skipif(not os.path.isdir(shmfiles.SHM_DIR), reason="needs /dev/shm")
def test_a_killed_worker_gives_a_clear_error_and_leaves_no_slot_files(dataset: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", KILLED, str(dataset)], capture_output=True, text=True, env=env, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    died = [line for line in proc.stdout.splitlines() if line.startswith("DIED")]
    assert died, proc.stdout + proc.stderr[-3000:]
    pid = died[0].split()[1]
    assert f"pid {pid})" in died[0] or f"pid(s) {pid})" in died[0], died[0]  # names the worker
    assert "out-of-memory" in died[0] and "resume" in died[0]
    assert "LEFT []" in proc.stdout, proc.stdout
