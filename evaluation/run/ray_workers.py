"""Data-parallel evaluation on Ray: `run.workers=N`.

Each worker is a Ray actor that loads the model and builds the method once, warms up, then answers the questions
it is handed one at a time (a free worker gets the next question). The answer records come back to this process,
which alone writes the run folder through the same `evaluation.run.orchestrate.run_once` as a run without workers:
the same identity and folder, the same resume, error records and one-writer lock. Each record names the worker
that answered it, and the manifest lists the workers and their devices.

A worker that hangs does not hang the run: a question not answered within `run.question_timeout_s` is recorded as
an error (`TimeoutError: no answer after 1800 s on worker 3`; the next run of the same command asks it again), its
worker is killed (`ray.kill`: a hung forward cannot be interrupted otherwise), and while questions are left a
fresh worker is started in its place, loaded, checked and warmed up like the first ones, so the run keeps its
number of workers and every timed answer comes from a warmed-up worker. Loading a worker has no timeout; its
warm-up has `bench.warmup` times the question's, and a warm-up past it stops the run in one line.

A worker sees only the GPUs Ray gives it (`run.gpus_per_worker`, by default 1 on a cluster with GPUs, else 0), so
`run.device=auto` puts it on its own GPU; a worker of `gpus_per_worker=2` with `model.device_map=auto` splits the
model over its two. Ray is imported here only, so a run without `run.workers` never imports it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from collections import deque
from types import SimpleNamespace

import torch

from evaluation.engine.errors import HarnessError
from evaluation.models import model_directory, prepacks, resolve_dtype
from evaluation.provenance import environment
from evaluation.run.answer import error_record, one_line
from evaluation.run.answerers import InProcess, load_target

# Only answer records travel through Ray's object store (a few kB each; the model loads from disk in each worker),
# so a Ray started here reserves little shared memory.
OBJECT_STORE_BYTES = 128 * 2**20
# Settings a worker must share with this process, whichever node's environment its Ray was started in.
PASSED_ENVIRONMENT = ("SPECDEC_CACHE", "HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def import_ray():
    try:
        import ray
    except ImportError:
        raise HarnessError("run.workers needs Ray: `make setup-cluster` (pip install -r requirements-cluster.txt)") \
            from None
    return ray


class Worker:
    """One Ray actor: the model and method loaded once (an `InProcess` answerer), then one question at a time."""

    def __init__(self, index: int, spec, questions: list, threads: int):
        torch.set_num_threads(threads)  # its share of the node's cores, not all of them
        self.index = index
        try:
            self.here = InProcess(spec, load_target(spec, questions))
            self.error = None
        except HarnessError as exc:  # reported by `describe`, as one line, before anything is written
            self.error = str(exc)

    def describe(self) -> dict:
        if self.error is not None:
            return {"index": self.index, "error": self.error}
        lm = self.here.lm
        env = environment(lm)
        return {
            "index": self.index,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "device": str(lm.device),
            "gpu": env["gpu"],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "torch_threads": torch.get_num_threads(),
            "source": lm.source,
            "dtype": str(lm.dtype).replace("torch.", ""),
            "prepacked": lm.prepacked,
            "latency_source": self.here.latency_source,
            "environment": env,
        }

    def warm_up(self, question) -> None:
        self.here.warm_up(question)

    def answer(self, question) -> dict:
        record = self.here.answer(question)
        record["worker"] = self.index
        return record


def timeout_record(spec, question, seconds: float, worker: int) -> dict:
    """The error record of a question its worker did not answer in `seconds`, naming the worker."""
    message = f"TimeoutError: no answer after {seconds:g} s on worker {worker}"
    return {**error_record(spec, question, message), "worker": worker}


def worker_failed(exc) -> HarnessError:
    """A dead worker (out of memory, a lost node) as one line; what was written stays, and a rerun resumes."""
    return HarnessError(f"a Ray worker failed ({one_line(exc)[:300]}); run the same command again to resume")


def predicted_device(spec, cluster_gpus: float) -> tuple[torch.device, float]:
    """The device the workers will load on, and the GPUs each gets, from the options and the cluster's GPUs."""
    gpus = spec.run.gpus_per_worker
    if gpus is None:
        gpus = 1.0 if spec.run.device != "cpu" and cluster_gpus > 0 else 0.0
    if spec.run.device == "cuda" and cluster_gpus == 0:
        raise HarnessError("run.device=cuda with run.workers, but the Ray cluster has no GPUs")
    if gpus > cluster_gpus:
        raise HarnessError(f"run.gpus_per_worker={gpus:g} but the Ray cluster has {cluster_gpus:g} GPUs")
    return torch.device("cuda" if gpus > 0 else "cpu"), gpus


class RayWorkers:
    """`run.workers` Ray actors behind the `evaluation.run.answerers.Answerer` interface."""

    # The class each actor runs: a seam for tests (tests/test_scale.py puts a worker that hangs in its place).
    worker_class = Worker

    def __init__(self, ray, spec, questions):
        self.ray, self.spec, self.questions = ray, spec, questions
        device, self.gpus = predicted_device(spec, ray.cluster_resources().get("GPU", 0))
        self.threads = spec.run.cpus_per_worker or 1
        # The run's identity comes from what the workers will load, known before any of them starts, so a finished
        # run is recognised without loading a model; `start` checks that the workers agree.
        dtype = resolve_dtype(spec.model.dtype, device)
        self.model = SimpleNamespace(source=model_directory(spec.model), dtype=dtype, device=device,
                                     prepacked=prepacks(spec.model, device, dtype))
        self.actors: dict = {}  # worker index -> actor handle, of the workers alive
        self.started = 0  # workers started so far: the next one's index (a replaced worker's is not reused)
        self.described: list[dict] = []
        self.warm_question = None  # what the workers warmed up on, for a worker started in place of a hung one

    def start(self, questions: int) -> None:
        """Workers for `questions` questions: `run.workers` of them at most, started once and kept for the repeats."""
        wanted = min(self.spec.run.workers, max(questions, 1))
        if len(self.actors) < wanted:
            self._launch(wanted - len(self.actors))

    def _launch(self, count: int) -> list:
        """`count` more workers, loaded and checked against what this process expects; returns their indices."""
        ray = self.ray
        passed = {name: os.environ[name] for name in PASSED_ENVIRONMENT if name in os.environ}
        actor = ray.remote(num_cpus=self.threads, num_gpus=self.gpus, max_restarts=0,
                           runtime_env={"env_vars": passed} if passed else None)(self.worker_class)
        indices = range(self.started, self.started + count)
        self.started += count
        new = [actor.remote(i, self.spec, self.questions, self.threads) for i in indices]
        self.actors.update(zip(indices, new))  # killed by `close` even when the checks below fail
        described = self._get([a.describe.remote() for a in new])
        for worker in described:
            if "error" in worker:
                raise HarnessError(worker["error"])
            found = (worker["source"], worker["dtype"], torch.device(worker["device"]).type, worker["prepacked"])
            expected = (self.model.source, str(self.model.dtype).replace("torch.", ""), self.model.device.type,
                        self.model.prepacked)
            if found != expected:
                raise HarnessError(f"worker {worker['index']} on {worker['host']} loaded {found}, this process "
                                   f"expects {expected}: every node needs the same model path and cache folder")
        self.described += described
        # Per-question timings of one run must come from one kind of processor: methods are compared on it.
        kinds = sorted({w["gpu"] or w["environment"]["cpu"] for w in self.described})
        if len(kinds) > 1:
            raise HarnessError(f"the workers run on different processors ({', '.join(kinds)}): run each kind "
                               "apart (a Ray cluster of one GPU type), as methods are compared on one")
        return list(indices)

    def _get(self, refs, timeout: float | None = None):
        try:
            return self.ray.get(refs, timeout=timeout)
        except self.ray.exceptions.GetTimeoutError:  # only warm-ups are waited on with a timeout
            raise HarnessError(f"a Ray worker did not finish its warm-up in {timeout:g} s (bench.warmup times "
                               "run.question_timeout_s); run the same command again to resume") from None
        except self.ray.exceptions.RayError as exc:  # a worker died (out of memory, a lost node)
            raise worker_failed(exc) from None

    @property
    def workers(self) -> list[dict]:
        keys = ("index", "host", "pid", "device", "gpu", "cuda_visible_devices", "torch_threads")
        return [{key: w[key] for key in keys} | {"ray": self.ray.__version__} for w in self.described]

    @property
    def latency_source(self):
        return self.described[0]["latency_source"] if self.described else None

    def environment(self) -> dict:
        # The first worker's machine, with this process's command line (a worker's is Ray's own).
        return {**self.described[0]["environment"], "command": " ".join(sys.argv)}

    def warm_up(self, question) -> None:
        """Every worker warms up before any question is timed."""
        self.warm_question = question
        self._warm(self.actors.values())

    def _warm(self, actors) -> None:
        if self.spec.bench.warmup and self.warm_question is not None:
            limit = self.spec.run.question_timeout_s
            self._get([a.warm_up.remote(self.warm_question) for a in actors],
                      None if limit is None else limit * self.spec.bench.warmup)

    def answer(self, question) -> dict:
        [record] = self.answers([question])
        return record

    def answers(self, questions):
        """Records in the order they finish; a free worker gets the next question. A question still unanswered
        `run.question_timeout_s` after its worker took it is recorded as an error, and its worker killed and, while
        questions are left, replaced (the module's docstring)."""
        ray, limit = self.ray, self.spec.run.question_timeout_s
        todo = deque(questions)
        free = deque(self.actors)  # worker indices, in order: the first questions go to the first workers
        running: dict = {}  # object ref -> (worker index, question, deadline or None)
        while todo or running:
            if todo and not free and not running:  # every worker was lost to a timeout: a fresh one goes on
                free.append(self._replace())
            while free and todo:
                index, question = free.popleft(), todo.popleft()
                deadline = None if limit is None else time.monotonic() + limit  # the worker is idle: it starts now
                running[self.actors[index].answer.remote(question)] = (index, question, deadline)
            deadlines = [deadline for _, _, deadline in running.values() if deadline is not None]
            ray.wait(list(running), num_returns=1,
                     timeout=max(0.0, min(deadlines) - time.monotonic()) if deadlines else None)
            now = time.monotonic()  # a question not ready after this has run past its deadline if it was due by now
            ready, waiting = ray.wait(list(running), num_returns=len(running), timeout=0)
            for ref in ready:
                index, _, _ = running.pop(ref)
                free.append(index)
                yield self._get(ref)
            for ref in waiting:
                index, question, deadline = running[ref]
                if deadline is not None and deadline <= now:
                    del running[ref]
                    ray.kill(self.actors.pop(index))  # a hung forward is only stopped with its process
                    yield timeout_record(self.spec, question, limit, index)
                    if todo:
                        free.append(self._replace())

    def _replace(self) -> int:
        """A fresh worker in place of a killed one, loaded, checked and warmed up as the others; its index."""
        [index] = self._launch(1)
        self._warm([self.actors[index]])
        return index

    def close(self) -> None:
        for actor in self.actors.values():
            self.ray.kill(actor)
        self.actors = {}


def connect(ray, spec) -> bool:
    """Join the configured cluster, or start one on this machine; True when this call started it."""
    if ray.is_initialized():  # a test's cluster, or a job the Ray launcher runs inside a cluster
        return False
    if spec.run.ray_address:
        ray.init(address=spec.run.ray_address)
    else:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # nothing leaves the machine (clusters are often offline)
        ray.init(object_store_memory=OBJECT_STORE_BYTES, include_dashboard=False)
    return True


@contextlib.contextmanager
def ray_answerer(spec, questions):
    """The Ray workers of a run (`run.workers`), on the configured cluster or one started here; the workers are
    killed and a Ray started here is shut down when the run ends."""
    ray = import_ray()
    started = connect(ray, spec)
    workers = None
    try:
        workers = RayWorkers(ray, spec, questions)
        yield workers
    finally:
        if workers is not None:
            workers.close()
        if started:
            ray.shutdown()
