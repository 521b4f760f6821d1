"""Tensor-parallel workers: ranks 1 .. p-1 of an engine, one process each (nano-vllm's design).

Rank 0 is the engine's own process: it schedules, lays out each step (``ModelRunner.layout``) and
sends the layout (plain lists: token ids, positions, slots, block tables) to every worker through
a pipe, then runs the step itself. Each worker runs the same forward over its share of the
weights (``model.parallel``) and its own KV pool, and the ranks meet in the collectives
(``torch.distributed``: NCCL across CUDA devices, gloo on CPUs). The scheduler, the block manager
and the prefix cache live in rank 0 alone; the workers hold no state but their weights and pool.

Lifetime: ``start_workers`` spawns the processes (``spawn``, not ``fork``: a forked child of a
process that already runs OpenMP or CUDA threads can deadlock), each loads its slices of the
checkpoint while rank 0 loads its own, then waits for the pool's size. ``Workers.close`` (called
by ``LLMEngine.close``, its context manager, and at interpreter exit) asks them to leave, waits,
and kills what is left. A worker that fails sends its traceback and exits; rank 0's next collective
then fails (gloo sees the connection close; every collective has a timeout,
``COLLECTIVE_TIMEOUT_S``), and ``raise_if_failed`` turns that into an error naming the worker.

On a CPU the ranks share the machine's cores: each gets ``cores // p`` threads (rank 0 too, for
the engine's lifetime), so the p processes never ask for more threads than there are cores.
"""

from __future__ import annotations

import atexit
import traceback
from dataclasses import dataclass

import torch
import torch.multiprocessing as mp

from minieng.config import EngineConfig
from minieng.device import select_device, select_dtype, usable_cores
from minieng.engine.model_runner import ModelRunner
from minieng.model.kv_cache import KVCache
from minieng.model.loader import load_model
from minieng.model.parallel import host_group, host_store, join_group

COLLECTIVE_TIMEOUT_S = 300  # a rank waits this long in a collective (or at start-up) before failing
JOIN_TIMEOUT_S = 10  # a worker asked to leave gets this long before it is killed

# This process's torch threads before its first open CPU tensor-parallel engine, and how many are
# open: the last one to close gives the threads back (engines may close in any order).
_saved_threads: list[int] = []


def _share_cores(threads: int) -> None:
    _saved_threads.append(torch.get_num_threads())
    torch.set_num_threads(threads)


def _give_cores_back() -> None:
    first = _saved_threads[0]
    _saved_threads.pop()
    if not _saved_threads:
        torch.set_num_threads(first)


class WorkerError(RuntimeError):
    """A tensor-parallel worker failed or exited; the engine cannot step any further."""


def rank_devices(device: torch.device, size: int) -> list[torch.device]:
    """The device of each rank: consecutive CUDA devices from ``device``'s index, or the CPU for all.

    Raises ``ValueError`` for more ranks than CUDA devices, or than CPU cores.
    """
    if device.type == "cuda":
        first = device.index or 0
        count = torch.cuda.device_count()
        if first + size > count:
            raise ValueError(
                f"tensor_parallel_size={size} from cuda:{first} needs {first + size} CUDA devices; "
                f"torch sees {count}: lower tensor_parallel_size"
            )
        return [torch.device("cuda", first + r) for r in range(size)]
    cores = usable_cores()
    if size > cores:
        raise ValueError(
            f"tensor_parallel_size={size} needs a CPU core per rank; this machine has {cores}: lower tensor_parallel_size"
        )
    return [torch.device("cpu")] * size


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker is started with (pickled to the spawned process)."""

    config: EngineConfig
    max_model_len: int
    size: int
    port: int  # rank 0's TCP store (``parallel.host_store``)
    threads: int  # torch threads per rank on a CPU


def worker_main(rank: int, spec: WorkerSpec, conn) -> None:
    """A worker's whole life: join the group, load this rank's share, size the pool, then run
    every layout rank 0 sends until told to close (or until rank 0's end of the pipe closes)."""
    try:
        config = spec.config
        device = rank_devices(select_device(config.device), spec.size)[rank]
        if device.type == "cpu":
            torch.set_num_threads(spec.threads)
        else:
            torch.cuda.set_device(device)
        tp = join_group(rank, spec.size, spec.port, device, COLLECTIVE_TIMEOUT_S)
        dtype = select_dtype(config.dtype, device)
        model = load_model(config, device, dtype, spec.max_model_len, tp=tp).model
        conn.send(("loaded", None))
        _, num_blocks = conn.recv()
        kv_cache = KVCache(model.local_config, num_blocks, config.block_size, dtype, device)
        runner = ModelRunner(model, kv_cache, None, device, attention_backend=config.attention_backend)
        while True:
            command, *args = conn.recv()
            if command == "step":
                runner.run_layout(*args)
            elif command == "time_all_reduce":
                tp.time_all_reduce(*args, device=device, dtype=dtype)
            elif command == "close":
                break
    except EOFError:  # rank 0 is gone: nothing left to serve
        pass
    except BaseException:  # noqa: BLE001 (whatever it is, rank 0 must hear of it)
        try:
            conn.send(("error", traceback.format_exc()))
        except OSError:
            pass
        raise SystemExit(1) from None


class Workers:
    """Rank 0's handle on the other ranks: sends them each step and closes them.

    ``tp``: rank 0's own ``TensorParallel`` (its model's); ``processes`` and ``conns``: the
    workers', rank 1 first.
    """

    def __init__(self, config: EngineConfig, device: torch.device, max_model_len: int):
        size = config.tensor_parallel_size
        store = host_store(size, COLLECTIVE_TIMEOUT_S)
        spec = WorkerSpec(config, max_model_len, size, store.port, max(1, usable_cores() // size))
        self.spec = spec
        self.closed = False
        self.shares_cores = device.type == "cpu"
        if self.shares_cores:
            _share_cores(spec.threads)
        ctx = mp.get_context("spawn")
        self.conns, self.processes = [], []
        for rank in range(1, spec.size):
            mine, theirs = ctx.Pipe()
            process = ctx.Process(target=worker_main, args=(rank, spec, theirs), daemon=True, name=f"minieng-tp{rank}")
            process.start()
            theirs.close()
            self.conns.append(mine)
            self.processes.append(process)
        atexit.register(self.close)
        try:
            self.tp = host_group(store, size, device, COLLECTIVE_TIMEOUT_S)
        except Exception as e:
            self.close()
            raise WorkerError(f"the tensor-parallel group did not form: {e}") from e

    def _receive(self, expected: str) -> None:
        """Wait for ``expected`` from every worker; ``WorkerError`` for an error or an exit instead."""
        for rank, conn in enumerate(self.conns, start=1):
            try:
                message, payload = conn.recv()
            except EOFError:
                self.raise_if_failed(None)
            if message != expected:
                self.close()
                raise WorkerError(
                    f"tensor-parallel worker {rank} sent {message!r} where {expected!r} was due:\n{payload}"
                )

    def wait_loaded(self) -> None:
        """Wait until every worker has loaded its share. Raises ``WorkerError`` if one failed."""
        self._receive("loaded")

    def allocate_kv(self, num_blocks: int) -> None:
        """Have every worker allocate its KV pool of ``num_blocks`` blocks (its KV heads)."""
        self._send(("kv", num_blocks))

    def step(self, layout, fresh_blocks: list[int]) -> None:
        """Send a step's layout (``model_runner.StepLayout`` without its sequences) to every worker."""
        self._send(("step", layout, fresh_blocks))

    def time_all_reduce(self, sizes_bytes: list[int], repeats: int, device, dtype) -> list[list[float]]:
        """Seconds of ``repeats`` all-reduces of each size, timed on rank 0 while every worker runs
        the same loop (``TensorParallel.time_all_reduce``)."""
        self._send(("time_all_reduce", sizes_bytes, repeats))
        return self.tp.time_all_reduce(sizes_bytes, repeats, device=device, dtype=dtype)

    def _send(self, message) -> None:
        if self.closed:
            raise WorkerError("the tensor-parallel workers are closed: this engine cannot step any more")
        for conn in self.conns:
            try:
                conn.send(message)
            except (BrokenPipeError, ConnectionResetError, EOFError):
                self.raise_if_failed(None)

    def raise_if_failed(self, cause: BaseException | None) -> None:
        """Raise ``WorkerError`` naming the workers that exited or reported an error (with their
        traceback), after ``cause`` (a failed collective, a broken pipe); close the rest."""
        reasons = []
        for rank, (process, conn) in enumerate(zip(self.processes, self.conns), start=1):
            process.join(timeout=0.5 if process.is_alive() else 0)
            report = ""
            try:
                while conn.poll():
                    message, payload = conn.recv()
                    if message == "error":
                        report = f":\n{payload}"
            except (EOFError, OSError):
                pass
            if report or not process.is_alive():
                reasons.append(f"worker {rank} (pid {process.pid}) exited with code {process.exitcode}{report}")
        if reasons or cause is None:
            self.close()
            raise WorkerError("tensor-parallel " + ("; ".join(reasons) or f"workers unreachable ({cause})")) from cause

    def close(self) -> None:
        """Ask every worker to leave, wait ``JOIN_TIMEOUT_S``, kill what remains, leave the group
        and give rank 0 its threads back. Safe to call twice."""
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self.close)
        for conn in self.conns:
            try:
                conn.send(("close",))
            except OSError:
                pass
        for process in self.processes:
            process.join(timeout=JOIN_TIMEOUT_S)
            if process.is_alive():
                process.kill()
                process.join()
        for conn in self.conns:
            conn.close()
        self.tp = None  # the group and its store go with it
        if self.shares_cores:
            _give_cores_back()


def start_workers(config: EngineConfig, device: torch.device, max_model_len: int) -> Workers:
    """Spawn ranks 1 .. p-1 of ``config.tensor_parallel_size`` and join them as rank 0 on ``device``.

    They start loading their shares at once; call ``wait_loaded`` after rank 0 has loaded its own.
    Raises ``ValueError`` for more ranks than devices, ``WorkerError`` when the group cannot form.
    """
    rank_devices(device, config.tensor_parallel_size)
    return Workers(config, device, max_model_len)
