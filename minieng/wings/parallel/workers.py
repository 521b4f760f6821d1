"""Tensor-parallel workers: ranks 1 .. p-1 of an engine, one process each (nano-vllm's design).

Rank 0 is the engine's own process: it schedules, lays out each step (``ModelRunner.layout``) and
sends the layout (plain lists: token ids, positions, slots, block tables) to every worker through
a pipe, then runs the step itself. Each worker runs the same forward over its share of the
weights (``tensor_parallel.RankShard``) and its own KV pool, and the ranks meet in the collectives
(``torch.distributed``: NCCL across CUDA devices, gloo on CPUs). The scheduler, the block manager
and the prefix cache live in rank 0 alone; the workers hold no state but their weights and pool.

Each engine's group is a process group of its own (``join_group``: a TCP store on 127.0.0.1 and a
gloo or NCCL group object), not ``torch.distributed``'s global default, so several
tensor-parallel engines can live in one process (a notebook rebuilding one, a test beside
another).

Lifetime: ``Workers`` spawns the processes (``spawn``, not ``fork``: a forked child of a
process that already runs OpenMP or CUDA threads can deadlock), each loads its slices of the
checkpoint while rank 0 loads its own, then waits for the pool's size. ``Workers.close`` (called
by ``LLMEngine.close``, its context manager, and at interpreter exit) asks them to leave, waits,
and kills what is left. Workers ignore SIGINT: an interrupt is rank 0's to handle (a Jupyter
interrupt reaches rank 0 alone; Ctrl-C in a terminal reaches them all).

Failures: a worker that fails sends its traceback and exits. Rank 0's next collective then fails
(gloo sees the connection close; every collective and the group's forming time out after
``COLLECTIVE_TIMEOUT_S``), and ``abandon`` turns that into a ``WorkerError`` naming the worker.
Any exception in rank 0 once a step's layout is sent (an interrupt, an out-of-memory) leaves the
ranks out of step, so ``abandon`` closes the workers: the engine cannot step again. On CUDA, NCCL
does not notice a dead peer the way gloo does: rank 0 waits for the timeout (not tested here: no
machine with two GPUs was at hand).

On a CPU the ranks share the machine's cores: each gets ``cores // p`` threads (rank 0 too, for
the engine's lifetime), so the p processes never ask for more threads than there are cores.
"""

from __future__ import annotations

import atexit
import signal
import threading
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from minieng.config import EngineConfig
from minieng.device import select_device, select_dtype, usable_cores
from minieng.core.kv_cache import KVCache
from minieng.core.model_runner import ModelRunner
from minieng.model.loader import load_model
from minieng.wings.fast_paths.strategy import use_attention_backend
from minieng.wings.parallel.tensor_parallel import RankShard, TensorParallel

COLLECTIVE_TIMEOUT_S = 60  # a rank waits this long in a collective, or for the group to form, before failing
JOIN_TIMEOUT_S = 10  # a worker asked to leave gets this long before it is killed


class WorkerError(RuntimeError):
    """A tensor-parallel worker failed or exited; the engine cannot step any further."""


@contextmanager
def closing_on_error(workers: Workers | None):
    """Close ``workers`` if the block raises: an engine that fails to build leaves no process behind."""
    try:
        yield
    except BaseException:
        if workers is not None:
            workers.close()
        raise


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


def join_group(rank: int, size: int, store, device: torch.device) -> TensorParallel:
    """Rank ``rank``'s ``TensorParallel`` over ``store`` (rank 0's TCP store), NCCL on CUDA, gloo on
    a CPU, on 127.0.0.1 whatever the host's name resolves to. Blocks until all ``size`` ranks have
    joined; raises after ``COLLECTIVE_TIMEOUT_S``."""
    timeout = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    if device.type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        group = dist.ProcessGroupNCCL(store, rank, size, options)
    else:
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        group = dist.ProcessGroupGloo(store, rank, size, options)
    tp = TensorParallel(rank, size, group, store=store)
    tp.sync(device)  # returns once every rank has joined
    return tp


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker is started with (pickled to the spawned process)."""

    config: EngineConfig
    resolved: tuple  # rank 0's ``loader.load_config``: the model's directory, configs (no second download)
    max_model_len: int
    size: int
    port: int  # rank 0's TCP store
    threads: int  # torch threads per rank on a CPU


def worker_main(rank: int, spec: WorkerSpec, conn) -> None:
    """A worker's whole life: join the group, load this rank's share, then serve rank 0's
    commands (the pool's size, steps, the all-reduce's timing) until told to close, or until rank
    0's end of the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # rank 0 handles interrupts
    try:
        config = spec.config
        device = rank_devices(select_device(config.device), spec.size)[rank]
        if device.type == "cpu":
            torch.set_num_threads(spec.threads)
        else:
            torch.cuda.set_device(device)
        timeout = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
        store = dist.TCPStore("127.0.0.1", spec.port, spec.size, is_master=False, timeout=timeout)
        tp = join_group(rank, spec.size, store, device)
        dtype = select_dtype(config.dtype, device)
        model = load_model(config, device, dtype, spec.max_model_len, spec.resolved, RankShard(tp)).model
        conn.send(("loaded", None))
        runner = None
        while True:
            command, *args = conn.recv()
            if command == "step":
                runner.run_layout(*args)
            elif command == "kv":
                num_blocks, max_gather_tokens = args
                runner = ModelRunner(model, KVCache.for_model(model, num_blocks, config.block_size), None)
                runner.max_gather_tokens = max_gather_tokens
                use_attention_backend(config.attention_backend, runner)
            elif command == "time_all_reduce":
                sizes_bytes, repeats, message_dtype = args
                tp.time_all_reduce(sizes_bytes, repeats, device, message_dtype)
            elif command == "close":
                break
            else:
                raise ValueError(f"unknown command {command!r} from rank 0")
    except EOFError:  # rank 0 is gone: nothing left to serve
        pass
    except BaseException:  # noqa: BLE001 (whatever it is, rank 0 must hear of it)
        try:
            conn.send(("error", traceback.format_exc()))
        except OSError:
            pass
        raise SystemExit(1) from None


class _CoreShare:
    """This process's torch threads while CPU tensor-parallel engines are open: ``cores // p`` each,
    and the count from before the first one once the last one closes (in any order)."""

    def __init__(self):
        self.open, self.before = 0, None

    def take(self, threads: int) -> None:
        if self.open == 0:
            self.before = torch.get_num_threads()
        self.open += 1
        torch.set_num_threads(threads)

    def give_back(self) -> None:
        self.open -= 1
        if self.open == 0:
            torch.set_num_threads(self.before)


_CORES = _CoreShare()


class Workers:
    """Rank 0's handle on the other ranks: spawns them and joins their group (``Workers(...)``
    raises ``WorkerError`` when the group cannot form), sends them each step and closes them.

    ``tp``: rank 0's own ``TensorParallel`` (its model's); ``processes`` and ``conns``: the
    workers', rank 1 first.
    """

    def __init__(self, config: EngineConfig, device: torch.device, max_model_len: int, resolved: tuple):
        size = config.tensor_parallel_size
        timeout = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
        store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, timeout=timeout, wait_for_workers=False)
        spec = WorkerSpec(config, resolved, max_model_len, size, store.port, max(1, usable_cores() // size))
        self.device, self.closed, self.shares_cores, self.tp = device, False, device.type == "cpu", None
        self.conns, self.processes = [], []
        atexit.register(self.close)
        if self.shares_cores:
            _CORES.take(spec.threads)
        try:
            ctx = mp.get_context("spawn")
            for rank in range(1, size):
                mine, theirs = ctx.Pipe()
                process = ctx.Process(
                    target=worker_main, args=(rank, spec, theirs), daemon=True, name=f"minieng-tp{rank}"
                )
                process.start()
                theirs.close()
                self.conns.append(mine)
                self.processes.append(process)
            self.tp = self._join_watching(size, store, device)
        except Exception as e:  # a worker that died before joining says why in its pipe
            reasons = self._failures()
            self.close()
            raise WorkerError(
                f"the tensor-parallel group did not form: {'; '.join(reasons) or e}. A script that builds a "
                'tensor-parallel engine needs the `if __name__ == "__main__":` guard (workers import it again)'
            ) from e

    def _join_watching(self, size: int, store, device: torch.device) -> TensorParallel:
        """``join_group`` as rank 0, in a thread, while watching the workers: one that exits first (a
        script without its main guard, a failed import) is an error at once, not after the timeout.
        The thread, left waiting then, ends at the timeout; it is a daemon, and holds nothing up."""
        joined: dict = {}

        def join() -> None:
            try:
                joined["tp"] = join_group(0, size, store, device)
            except Exception as e:  # noqa: BLE001 (handed to the caller below)
                joined["error"] = e

        thread = threading.Thread(target=join, name="minieng-tp-join", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(0.1)
            dead = [p for p in self.processes if not p.is_alive()]
            if dead and thread.is_alive():
                raise WorkerError(f"worker {dead[0].name} exited with code {dead[0].exitcode} before joining")
        if "error" in joined:
            raise joined["error"]
        return joined["tp"]

    def wait_loaded(self) -> None:
        """Wait until every worker has loaded its share. Raises ``WorkerError`` if one failed."""
        for rank, conn in enumerate(self.conns, start=1):
            try:
                message, payload = conn.recv()
            except EOFError:
                message, payload = "exit", ""
            if message != "loaded":
                reasons = self._failures()
                self.close()
                raise WorkerError(f"tensor-parallel worker {rank} did not load: {'; '.join(reasons) or payload}")

    def allocate_kv(self, num_blocks: int, max_gather_tokens: int | None) -> None:
        """Have every worker allocate its KV pool of ``num_blocks`` blocks (its KV heads), its decodes
        gathering at most ``max_gather_tokens`` keys at once, as rank 0's."""
        self._send(("kv", num_blocks, max_gather_tokens))

    def attach(self, runner: ModelRunner) -> None:
        """Run every layout of rank 0's ``runner`` on every rank, in lockstep: its ``run_layout``
        sends the layout first (``step``), and a failure once it is sent ``abandon``s the group.
        ``runner.last_comm_s``: the seconds rank 0 spent in collectives in the last forward."""
        run_layout, tp = runner.run_layout, runner.model.tp

        def run_in_lockstep(lay, fresh_blocks: list[int]):
            self.step(lay.plain, fresh_blocks)  # plain lists: what a worker runs
            comm_before = tp.comm_s
            try:
                logits = run_layout(lay, fresh_blocks)
            except BaseException as e:  # the ranks are out of step now: name a dead worker, close them all
                self.abandon(e)
            runner.last_comm_s = tp.comm_s - comm_before
            return logits

        runner.run_layout = run_in_lockstep

    def step(self, layout, fresh_blocks: list[int]) -> None:
        """Send a step's layout (``model_runner.StepLayout`` without its sequences) to every worker."""
        self._send(("step", layout, fresh_blocks))

    def time_all_reduce(self, sizes_bytes: list[int], repeats: int, dtype: torch.dtype) -> list[list[float]]:
        """Seconds of ``repeats`` all-reduces of each size, in ``dtype``, timed on rank 0 while every
        worker runs the same loop (``TensorParallel.time_all_reduce``)."""
        self._send(("time_all_reduce", sizes_bytes, repeats, dtype))
        return self.tp.time_all_reduce(sizes_bytes, repeats, self.device, dtype)

    def _send(self, message) -> None:
        if self.closed:
            raise WorkerError("the tensor-parallel workers are closed: this engine cannot step any more")
        for conn in self.conns:
            try:
                conn.send(message)
            except OSError as e:  # a broken pipe: the worker is gone
                self.abandon(e)

    def _failures(self) -> list[str]:
        """What each worker that exited or reported an error said."""
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
        return reasons

    def abandon(self, cause: BaseException) -> None:
        """After ``cause`` struck once a step was sent, the ranks are out of step: close the workers,
        then raise ``WorkerError`` naming those that failed, or ``cause`` itself when none did (an
        interrupt, an error of rank 0's own)."""
        reasons = self._failures()
        self.close()
        if reasons:
            raise WorkerError("tensor-parallel " + "; ".join(reasons)) from cause
        raise cause

    def close(self) -> None:
        """Ask every worker to leave, wait ``JOIN_TIMEOUT_S``, kill what remains, release the group
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
        if self.tp is not None:
            self.tp.release()
        if self.shares_cores:
            _CORES.give_back()
