"""Run one function as N ranks on this host, joined by a torch.distributed rendezvous, and watch them.

The parent holds the rendezvous store (a TCPStore on a free localhost port, the port the OS picked)
and polls its children: a rank that fails or dies stops every other rank at once, and so does a
rank that has not joined the rendezvous by the deadline; the failure comes back as one line. Each
rank writes its output to `workdir/rank-N.log`, its result to `result-N.pkl`, and on failure one line
to `error-N.txt`. Ranks are forked from a fork server that imports torch once (a fresh interpreter
per rank would import it N times; fork from this process could inherit its threads).
"""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from dsv4opt.capture.result import Progress, no_progress
from dsv4opt.errors import CaptureError, DsvOptError
from dsv4opt.fileio import write_bytes_atomic, write_text_atomic

HOST = "127.0.0.1"
# NVLink multicast off (the lent GPU machines require it: a program that uses it can put a shared
# host's GPUs out of service). NCCL's switch is always set; the other two only where unset.
NCCL_NVLS = {"NCCL_NVLS_ENABLE": "0"}
MULTICAST_OFF_DEFAULTS = {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
COLLECTIVE_TIMEOUT_S = 1800.0  # a collective waits this long for a peer that is alive but stuck
FAILURE_GRACE_S = 1.0  # after a first failure, how long to wait for the others to say why
POLL_S = 0.05


def rank_env(rank: int, ranks: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of one rank: the caller's, torchrun's rank variables, NVLink multicast off."""
    env = dict(os.environ if base is None else base)
    for key, value in MULTICAST_OFF_DEFAULTS.items():
        env.setdefault(key, value)
    env.update(NCCL_NVLS)
    env.update({"RANK": str(rank), "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(ranks), "GROUP_RANK": "0"})
    return env


@dataclass
class RankContext:
    """What a rank's entry function gets: who it is, where to write, how to join the others."""

    rank: int
    ranks: int
    backend: str  # gloo or nccl
    workdir: Path
    port: int
    _store: Any = field(default=None, repr=False)

    def join(self, device=None) -> None:
        """Enter the rendezvous: the default process group over all ranks (NCCL: bound to `device`)."""
        import torch.distributed as dist

        timeout = dt.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
        self._store = dist.TCPStore(HOST, self.port, is_master=False, timeout=timeout)
        self._store.set(f"arrived/{self.rank}", "1")
        kwargs = {"device_id": device} if device is not None and self.backend == "nccl" else {}
        dist.init_process_group(self.backend, store=dist.PrefixStore("pg", self._store), rank=self.rank,
                                world_size=self.ranks, timeout=timeout, **kwargs)
        self._store.set(f"joined/{self.rank}", "1")

    def progress(self) -> Progress:
        """Rank 0 reports its stages to the parent (every rank runs the same ones); the others stay quiet."""
        return _StoreProgress(self._store) if self.rank == 0 and self._store is not None else no_progress

    def leave(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


def run_ranks(entry: Callable[..., Any], ranks: int, backend: str, workdir: Path, args: tuple = (),
              rendezvous_timeout_s: float = 120.0, progress: Progress = no_progress,
              preload: tuple[str, ...] = ("torch",)) -> list[Any]:
    """entry(RankContext, *args) in `ranks` processes; their return values, by rank.

    `entry` must be importable by name (a module-level function) and call `ctx.join()` first.
    Raises CaptureError (one line) when a rank fails, dies or misses the rendezvous; no rank outlives
    this call.
    """
    import torch.distributed as dist

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    store = dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False,
                          timeout=dt.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    mp = multiprocessing.get_context("forkserver")
    mp.set_forkserver_preload(list(preload))
    procs: list = []
    try:
        for r in range(ranks):
            ctx = RankContext(rank=r, ranks=ranks, backend=backend, workdir=workdir, port=store.port)
            p = mp.Process(target=_rank_main, args=(entry, ctx, rank_env(r, ranks), args),
                           name=f"dsv4opt-rank-{r}", daemon=True)
            p.start()
            procs.append(p)
        _watch(procs, store, workdir, rendezvous_timeout_s, _ProgressRelay(store, progress))
        return [pickle.loads((workdir / f"result-{r}.pkl").read_bytes()) for r in range(ranks)]
    finally:
        _stop(procs)


def _rank_main(entry: Callable[..., Any], ctx: RankContext, env: dict[str, str], args: tuple) -> None:
    """A rank's process: its own environment and log, the entry, its result or its one-line error."""
    os.environ.clear()
    os.environ.update(env)
    log = open(ctx.workdir / f"rank-{ctx.rank}.log", "ab", buffering=0)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    code, message = 1, None
    try:
        result = entry(ctx, *args)
        write_bytes_atomic(ctx.workdir / f"result-{ctx.rank}.pkl", pickle.dumps(result))
        ctx.leave()
        code = 0
    except DsvOptError as exc:
        message = str(exc)
    except BaseException as exc:  # noqa: BLE001 - a rank reports whatever stopped it, then exits
        traceback.print_exc()
        message = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
        message += f" (traceback in {ctx.workdir / f'rank-{ctx.rank}.log'})"
    if message is not None:
        write_text_atomic(ctx.workdir / f"error-{ctx.rank}.txt", json.dumps({"t": time.time(), "message": message}))
    sys.stdout.flush()
    sys.stderr.flush()
    # No interpreter shutdown: a communicator's threads can block it when the peers are gone.
    os._exit(code)


def _watch(procs: list, store, workdir: Path, rendezvous_timeout_s: float, relay: "_ProgressRelay") -> None:
    ranks = len(procs)
    deadline = time.monotonic() + rendezvous_timeout_s
    joined = False
    first_failure = None
    while True:
        codes = [p.exitcode for p in procs]
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            first_failure = first_failure or time.monotonic()
            if all(c is not None for c in codes) or time.monotonic() - first_failure > FAILURE_GRACE_S:
                raise CaptureError(_failure_line(failed, codes, workdir))
        elif all(c == 0 for c in codes):
            relay.poll()  # the steps rank 0 reported since the last poll
            return
        if not joined:
            joined = store.check([f"joined/{r}" for r in range(ranks)])
            if not joined and time.monotonic() > deadline and not failed:
                raise CaptureError(_rendezvous_timeout_line(store, ranks, rendezvous_timeout_s, workdir))
        relay.poll()
        alive = [p.sentinel for p in procs if p.exitcode is None]
        if alive:
            multiprocessing.connection.wait(alive, timeout=POLL_S)


def _rendezvous_timeout_line(store, ranks: int, timeout_s: float, workdir: Path) -> str:
    missing = [r for r in range(ranks) if not store.check([f"arrived/{r}"])]
    who = (f"rank {', '.join(map(str, missing))} of {ranks} did not arrive" if missing
           else f"all {ranks} ranks arrived but the process group did not form")
    return f"rendezvous timed out: {who} within {timeout_s:g} s; all ranks were stopped (logs in {workdir})"


def _failure_line(failed: list[int], codes: list[int | None], workdir: Path) -> str:
    """One line for the failure that came first: a rank that died without saying why (killed, or
    exited without an error) is taken as the cause over ranks that failed after it, then the earliest."""
    said = {}
    for r in failed:
        path = workdir / f"error-{r}.txt"
        if path.exists():
            said[r] = json.loads(path.read_text())
    silent = [r for r in failed if r not in said]
    stopped = [r for r in range(len(codes)) if r not in failed]
    tail = f"; stopped rank {', '.join(map(str, stopped))}" if stopped else ""
    if silent:
        r, code = silent[0], codes[silent[0]]
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        return f"rank {r} of {len(codes)} {how} (its log: {workdir / f'rank-{r}.log'}){tail}"
    r = min(said, key=lambda k: said[k]["t"])
    return f"rank {r} of {len(codes)} failed: {said[r]['message']}{tail}"


def _stop(procs: list) -> None:
    """Terminate, then kill, every rank still running, and reap them all."""
    for p in procs:
        if p.exitcode is None:
            p.terminate()
    for p in procs:
        p.join(timeout=5)
        if p.exitcode is None:
            p.kill()
            p.join()


class _StoreProgress(Progress):
    """Rank 0's progress, written to the rendezvous store for the parent to relay: one key per stage
    (so a stage shorter than the parent's poll is still seen) and its steps done."""

    def __init__(self, store):
        self._store, self._stage, self._done = store, 0, 0

    def stage(self, description: str, total: int | None) -> None:
        self._stage, self._done = self._stage + 1, 0
        self._store.set(f"progress/{self._stage}/done", "0")
        self._store.set(f"progress/{self._stage}", json.dumps({"description": description, "total": total}))

    def advance(self) -> None:
        self._done += 1
        self._store.set(f"progress/{self._stage}/done", str(self._done))


class _ProgressRelay:
    """The parent's side: replays rank 0's stages and steps, in order, into the caller's Progress."""

    def __init__(self, store, progress: Progress):
        self._store, self._progress, self._stage, self._done = store, progress, 0, 0

    def poll(self) -> None:
        if self._progress is no_progress:
            return
        while True:
            self._catch_up()
            following = f"progress/{self._stage + 1}"
            if not self._store.check([following]):
                return
            stage = json.loads(self._store.get(following))
            self._stage, self._done = self._stage + 1, 0
            self._progress.stage(stage["description"], stage["total"])

    def _catch_up(self) -> None:
        if not self._stage:
            return
        done = int(self._store.get(f"progress/{self._stage}/done"))
        for _ in range(done - self._done):
            self._progress.advance()
        self._done = done
