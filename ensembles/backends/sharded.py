"""Teacher shards: one ``NextTokenBackend`` whose teachers live on several workers (docs/distributed.md).

Framework 2 (paper Section 1.2) runs every teacher in lockstep on the same released tokens, and Algorithm 1
(Section 3) makes teacher ``i``'s vote a function of its own distribution and the shared noise alone.  Since
the noise is keyed by the step and the token id, and Cold PATE's uniforms by the step and the teacher's
original index (:mod:`ensembles.keyed_votes`), a teacher votes the same on whichever worker it runs: the
ensemble splits into contiguous shards with no change to any vote.

* :class:`ShardedBackend`, the coordinator, implements the protocol.  It holds no model: at :meth:`begin` it
  sends each shard its teachers' prompts (once; never per step); per step, ``votes`` asks every shard for its
  teachers' votes (the step key and options out, one ``int32`` per teacher back) and concatenates them in
  global order, ``append`` broadcasts the released token, ``drop_teachers`` goes to the owning shards.
* A worker (:class:`ShardWorker`) builds its backend once from a picklable *spec* (an object with a
  ``build()`` method: :class:`BackendSpec`, :class:`TransformersSpec`) and runs the protocol on local
  indices ``0..m-1``.
* Executors run the workers: :class:`InProcessExecutor` (objects in this process, called in turn or from a
  thread pool) and :class:`RayExecutor` (one Ray actor per shard; ``ray`` is imported only there, extra
  ``distributed``).
* A lost worker (:class:`WorkerLostError`: a dead Ray actor) is rebuilt: a new worker, then its shard's
  prompts, dropped teachers and every released token are replayed, and the call is retried, at most
  ``max_rebuilds`` times per shard and run (:class:`ShardLostError` after that).

Nothing private is logged or put in an error message: errors name the shard, its (public) range of teachers
and what failed.  The prompts and released tokens a rebuild needs are kept in memory only.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import attr
import numpy as np

from ensembles.backends.base import NextTokenBackend
from ensembles.backends.transformers_backend import (
    TransformersBackend,
    resolve_model_path,
)
from ensembles.distributions import TeacherDistributions
from ensembles.keyed_votes import StepKey, check_histograms
from pate_accountant.validation import check_int, check_real

__all__ = [
    "BackendSpec",
    "InProcessExecutor",
    "RayExecutor",
    "ShardLostError",
    "ShardWorker",
    "ShardedBackend",
    "TokenizerCodec",
    "TransformersSpec",
    "WorkerLostError",
    "concat_distributions",
    "shard_bounds",
]

_log = logging.getLogger(__name__)

#: Rebuilds of one shard's worker allowed in one run (between two ``begin`` calls).
DEFAULT_MAX_REBUILDS = 3


class WorkerLostError(RuntimeError):
    """An executor's worker is gone (its process or actor died); the coordinator rebuilds it."""


class ShardLostError(RuntimeError):
    """A shard's worker was lost more often in one run than the coordinator may rebuild it."""


# -- specs and helpers ---------------------------------------------------------------------------------------
class BackendSpec:
    """``BackendSpec(factory, *args, **kwargs)``: a worker's backend is ``factory(*args, **kwargs)``.  For Ray
    the factory and arguments must pickle (a top-level function or class, plain arguments); in this process
    they may be anything, e.g. an already-loaded model that every shard then shares."""

    __slots__ = ("factory", "args", "kwargs")

    def __init__(self, factory, *args, **kwargs):
        if not callable(factory):
            raise TypeError(f"factory must be callable, got {type(factory).__name__}")
        self.factory, self.args, self.kwargs = factory, args, kwargs

    def build(self):
        return self.factory(*self.args, **self.kwargs)

    def __repr__(self):  # never the arguments: they may be large or private
        return f"BackendSpec({getattr(self.factory, '__qualname__', type(self.factory).__name__)})"


@attr.s(frozen=True, slots=True)
class TransformersSpec:
    """A :class:`~ensembles.backends.transformers_backend.TransformersBackend` that each worker loads itself
    from ``model``, a local model folder that every worker can read (:meth:`for_model` converts a GGUF file
    once, here).  :meth:`codec` gives the coordinator the tokenizer alone, for ``encode``/``decode``."""

    model: str = attr.ib(converter=str)
    threads: int | None = attr.ib(default=None)
    batch_size: int = attr.ib(default=32)
    device: str | None = attr.ib(default=None)
    dtype: str | None = attr.ib(default=None)

    @classmethod
    def for_model(cls, model, **kwargs) -> "TransformersSpec":
        """The spec of ``model`` (a folder, a ``.gguf`` file or a folder holding one; ``ValueError`` for a bad
        path), with a GGUF file converted to its cached safetensors folder first."""
        return cls(str(resolve_model_path(model)), **kwargs)

    def build(self):
        return TransformersBackend(self.model, threads=self.threads, batch_size=self.batch_size,
                                   device=self.device, dtype=self.dtype)

    def codec(self) -> "TokenizerCodec":
        from transformers import AutoTokenizer

        return TokenizerCodec(AutoTokenizer.from_pretrained(self.model))


class TokenizerCodec:
    """``encode``/``decode`` of a Hugging Face tokenizer exactly as ``TransformersBackend`` does them, with no
    model: the coordinator's tokenizer side."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode([int(t) for t in token_ids], skip_special_tokens=True)


def shard_bounds(num_teachers: int, num_shards: int) -> list[tuple[int, int]]:
    """Contiguous near-equal ranges ``[lo, hi)`` of ``num_teachers`` teachers over ``num_shards`` shards (the
    first ``num_teachers % num_shards`` shards hold one more; shards beyond ``num_teachers`` are empty)."""
    n = check_int("num_teachers", num_teachers, minimum=0)
    k = check_int("num_shards", num_shards, minimum=1)
    sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
    starts = np.concatenate(([0], np.cumsum(sizes))).astype(int)
    return [(int(starts[i]), int(starts[i + 1])) for i in range(k)]


def concat_distributions(parts: Sequence[TeacherDistributions]) -> TeacherDistributions:
    """The rows of ``parts`` (already validated distributions over one vocabulary) stacked in order."""
    parts = list(parts)
    if not parts:
        raise ValueError("concat_distributions needs at least one TeacherDistributions")
    vocab = parts[0].vocab_size
    if any(p.vocab_size != vocab for p in parts):
        raise ValueError("the distributions to concatenate must share one vocabulary size")
    if len(parts) == 1:
        return parts[0]
    indptr = np.zeros(sum(p.num_teachers for p in parts) + 1, dtype=np.int64)
    np.cumsum(np.concatenate([p.support_sizes for p in parts]), out=indptr[1:])
    return TeacherDistributions(
        indptr, np.concatenate([p.token_ids for p in parts]), np.concatenate([p.probs for p in parts]),
        np.concatenate([p.tail for p in parts]), vocab, _validated=True,
    )


# -- the worker ----------------------------------------------------------------------------------------------
class ShardWorker:
    """One shard: a backend built once from ``spec`` (:meth:`build`), running the protocol on the shard's
    teachers, indexed locally ``0..m-1``; ``offset`` (the shard's first global index) turns them into the
    original indices Cold PATE's votes are keyed by.  The same class runs in this process and as a Ray actor."""

    def __init__(self, spec):
        self.spec = spec
        self.backend = None
        self.offset = 0

    def build(self) -> dict:
        """Build the backend; return what the coordinator caches (vocabulary, eos, own transforms)."""
        backend = self.spec.build()
        if not isinstance(backend, NextTokenBackend):
            raise TypeError(f"the spec built a {type(backend).__name__}, which does not implement NextTokenBackend")
        self.backend = backend
        return {"vocab_size": int(backend.vocab_size), "eos_token_id": backend.eos_token_id,
                "temperature": getattr(backend, "temperature", 1.0), "top_p": getattr(backend, "top_p", None)}

    def begin(self, prompts, shared_prefix, offset: int) -> None:
        self.offset = int(offset)
        self.backend.begin(prompts, shared_prefix=shared_prefix)

    def replay(self, prompts, shared_prefix, offset: int, dropped, tokens) -> np.ndarray:
        """A rebuilt worker's state: begin, drop the shard's dropped teachers, append every released token
        (dropped first, so that they take no forward passes and no context-window checks)."""
        self.begin(prompts, shared_prefix, offset)
        if len(dropped):
            self.backend.drop_teachers(dropped)
        for token in tokens:
            self.backend.append(token)
        return self.backend.active_teachers()

    def check_prompts(self, prompts, shared_prefix) -> None:
        check = getattr(self.backend, "check_prompts", None)
        if check is not None:
            check(prompts, shared_prefix)

    def votes(self, key, temperature, top_p, histograms, teacher_ids=None, public=None) -> np.ndarray:
        if teacher_ids is None:
            teacher_ids = self.offset + self.backend.active_teachers()
        options = {} if public is None else {"public": public}
        return self.backend.votes(key, temperature=temperature, top_p=top_p, histograms=histograms,
                                  teacher_ids=teacher_ids, **options)

    def append(self, token_id: int) -> None:
        self.backend.append(token_id)

    def drop_teachers(self, local_indices) -> None:
        self.backend.drop_teachers(local_indices)

    def active_teachers(self) -> np.ndarray:
        return self.backend.active_teachers()

    def distributions(self) -> TeacherDistributions:
        return self.backend.distributions()

    def next_token_distributions(self, contexts) -> TeacherDistributions:
        return self.backend.next_token_distributions(contexts)

    def encode(self, text: str) -> list[int]:
        return list(self.backend.encode(text))

    def decode(self, token_ids) -> str:
        return self.backend.decode(token_ids)


class _LostWorker:
    """What :meth:`InProcessExecutor.kill_worker` leaves behind: every call fails as a lost worker's would."""

    def __getattr__(self, name):
        def lost(*args, **kwargs):
            raise WorkerLostError("the worker is gone")

        return lost


# -- executors -----------------------------------------------------------------------------------------------
class _Done:
    __slots__ = ("value", "error")

    def __init__(self, value=None, error=None):
        self.value, self.error = value, error


class InProcessExecutor:
    """Shards as :class:`ShardWorker` objects in this process, called one after the other, or each from its own
    thread with ``parallel=True`` (torch releases the GIL in its kernels, so shards on different devices, or
    a model with idle cores, overlap)."""

    def __init__(self, *, parallel: bool = False):
        self.parallel = bool(parallel)
        self._spec = None
        self._workers: list = []
        self._pool: ThreadPoolExecutor | None = None

    @property
    def workers(self) -> list:
        """The shards' :class:`ShardWorker` objects (for tests and inspection)."""
        return list(self._workers)

    def start(self, spec, num_workers: int) -> list[dict]:
        self._spec = spec
        self._workers = [ShardWorker(spec) for _ in range(num_workers)]
        if self.parallel and num_workers > 1:
            self._pool = ThreadPoolExecutor(max_workers=num_workers, thread_name_prefix="shard")
        return [self.result(self.submit(k, "build")) for k in range(num_workers)]

    def _invoke(self, worker: int, method: str, args):
        return getattr(self._workers[worker], method)(*args)

    def submit(self, worker: int, method: str, *args):
        if self._pool is not None:
            return self._pool.submit(self._invoke, worker, method, args)
        try:
            return _Done(value=self._invoke(worker, method, args))
        except Exception as exc:  # raised again by result(), like a future's
            return _Done(error=exc)

    def result(self, handle):
        if isinstance(handle, _Done):
            if handle.error is not None:
                raise handle.error
            return handle.value
        return handle.result()

    def restart(self, worker: int) -> dict:
        self._workers[worker] = ShardWorker(self._spec)
        return self.result(self.submit(worker, "build"))

    def kill_worker(self, worker: int) -> None:
        """Test hook: lose worker ``worker`` (its later calls raise :class:`WorkerLostError`)."""
        self._workers[worker] = _LostWorker()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._workers = []


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ImportError("Ray is not installed: pip install 'pate-accountant[distributed]' (ray>=2.5)") from None
    return ray


class RayExecutor:
    """One Ray actor per shard.

    ``address``: ``None`` (an already-initialised Ray, else ``ray.init()``'s default), ``"local"`` (start a
    local cluster with ``num_cpus`` CPUs, default all of this machine's) or a cluster address (``"auto"``,
    ``"host:6379"``, ``"ray://host:10001"``).  ``gpus_per_actor`` (default: 1 when the cluster has a free GPU
    for every actor, else 0): with GPUs the actors are placed through a placement group of one
    ``{"GPU": g, "CPU": c}`` bundle per actor (one actor per GPU); without, they are spread over the nodes.
    ``cpus_per_actor`` (``c``; default: 1, or an equal share of the free CPUs when fewer are free, down to 0, so
    that a second executor on a full cluster still starts).  ``init_kwargs`` go to ``ray.init`` (e.g. a
    ``runtime_env``).  Actors that have not built their backends within ``start_timeout_s`` (no room on the
    cluster, a slow disk) are an error.  The executor shuts Ray down on :meth:`close` only if it started it.
    """

    def __init__(self, address: str | None = None, *, num_cpus: int | None = None, cpus_per_actor=None,
                 gpus_per_actor=None, init_kwargs: dict | None = None, start_timeout_s: float = 600.0):
        self.address = address
        self.num_cpus = None if num_cpus is None else check_int("num_cpus", num_cpus, minimum=1)
        self.cpus_per_actor = None if cpus_per_actor is None else check_real("cpus_per_actor", cpus_per_actor,
                                                                             minimum=0.0)
        self.gpus_per_actor = None if gpus_per_actor is None else check_real("gpus_per_actor", gpus_per_actor,
                                                                             minimum=0.0)
        self.init_kwargs = dict(init_kwargs or {})
        self.start_timeout_s = check_real("start_timeout_s", start_timeout_s, minimum=0.0, min_open=True)
        self._ray = None
        self._owns_ray = False
        self._spec = None
        self._actors: list = []
        self._options: list[dict] = []
        self._group = None
        self._actor_class = None

    @property
    def actors(self) -> list:
        """The shards' actor handles (e.g. for ``ray.kill`` in a fault-tolerance test)."""
        return list(self._actors)

    def _init(self):
        ray = _import_ray()
        if not ray.is_initialized():
            kwargs = {"log_to_driver": False, "logging_level": "ERROR"}
            if self.address == "local":
                kwargs.update(address="local", num_cpus=self.num_cpus or os.cpu_count(), include_dashboard=False)
            elif self.address is not None:
                kwargs["address"] = self.address
            kwargs.update(self.init_kwargs)
            ray.init(**kwargs)
            self._owns_ray = True
        self._ray = ray
        return ray

    def connect(self) -> None:
        """Initialise Ray at :attr:`address` (or join the Ray this process already runs) without starting any
        actor, so that a caller can tell a bad or silent address from a failing model; :meth:`start` does it
        too, when it has not been done."""
        self._init()

    def start(self, spec, num_workers: int) -> list[dict]:
        ray = self._init() if self._ray is None else self._ray
        self._spec = spec
        free = ray.available_resources()
        gpus = self.gpus_per_actor
        if gpus is None:
            gpus = 1 if free.get("GPU", 0) >= num_workers else 0
        cpus = self.cpus_per_actor
        if cpus is None:
            cpus = min(1.0, float(free.get("CPU", 0)) / num_workers)
        if gpus > 0:
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            bundle = {"GPU": gpus, **({"CPU": cpus} if cpus > 0 else {})}
            self._group = placement_group([bundle] * num_workers, strategy="PACK")
            ready, _ = ray.wait([self._group.ready()], timeout=self.start_timeout_s)
            if not ready:
                raise RuntimeError(f"the Ray cluster cannot place {num_workers} actors of {gpus:g} GPU each within "
                                   f"{self.start_timeout_s:g} s")
            self._options = [
                {"num_gpus": gpus, "num_cpus": cpus, "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    placement_group=self._group, placement_group_bundle_index=k)}
                for k in range(num_workers)]
        else:
            self._options = [{"num_gpus": 0, "num_cpus": cpus, "scheduling_strategy": "SPREAD"}
                             for _ in range(num_workers)]
        self._actors = [self._new_actor(k) for k in range(num_workers)]
        return self._built([self.submit(k, "build") for k in range(num_workers)])

    def _built(self, handles) -> list[dict]:
        _, pending = self._ray.wait(handles, num_returns=len(handles), timeout=self.start_timeout_s)
        if pending:
            raise RuntimeError(f"{len(pending)} of {len(handles)} Ray actors did not build their backends within "
                               f"{self.start_timeout_s:g} s (no room on the cluster: free CPUs or GPUs?)")
        return [self.result(h) for h in handles]

    def _new_actor(self, worker: int):
        if self._actor_class is None:
            self._actor_class = self._ray.remote(ShardWorker)
        options = dict(max_restarts=0, max_task_retries=0, **self._options[worker])
        return self._actor_class.options(**options).remote(self._spec)

    def submit(self, worker: int, method: str, *args):
        return getattr(self._actors[worker], method).remote(*args)

    def result(self, handle):
        from ray.exceptions import RayActorError, RayTaskError

        try:
            return self._ray.get(handle)
        except RayActorError:
            raise WorkerLostError("the Ray actor died") from None
        except RayTaskError as exc:  # the worker's own exception, as raised there
            raise exc.cause from None

    def restart(self, worker: int) -> dict:
        try:
            self._ray.kill(self._actors[worker], no_restart=True)
        except Exception:  # already gone
            pass
        self._actors[worker] = self._new_actor(worker)
        return self._built([self.submit(worker, "build")])[0]

    def kill_worker(self, worker: int) -> None:
        """Test hook: ``ray.kill`` the actor of shard ``worker``."""
        self._ray.kill(self._actors[worker], no_restart=True)

    def close(self) -> None:
        ray = self._ray
        if ray is None:
            return
        if ray.is_initialized():
            for actor in self._actors:
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:  # already gone
                    pass
            if self._group is not None:
                from ray.util.placement_group import remove_placement_group

                remove_placement_group(self._group)
            if self._owns_ray:
                ray.shutdown()
        self._actors, self._group, self._ray, self._actor_class = [], None, None, None


# -- the coordinator -----------------------------------------------------------------------------------------
class ShardedBackend:
    """``ShardedBackend(spec, num_shards=2, *, executor=None, max_rebuilds=3)``: the ``NextTokenBackend`` of
    ``n`` teachers split into ``num_shards`` contiguous shards, each a worker's backend built from ``spec``
    (module docstring); ``executor`` defaults to :class:`InProcessExecutor`.  The workers start (and build
    their backends) here; :meth:`close` stops them (also a context manager).

    ``vocab_size``, ``eos_token_id`` (and the backends' own ``temperature``/``top_p``, which the generator
    checks) come from the workers once; ``encode``/``decode`` from ``spec.codec()`` when the spec has one (no
    model), else from shard 0.  A teacher-index-dependent backend (``ToyBackend``'s table form) sees its
    shard's local indices: give sharded teachers their identity through their prompts, as real ones have.
    """

    def __init__(self, spec, num_shards: int = 2, *, executor=None, max_rebuilds: int = DEFAULT_MAX_REBUILDS):
        if not callable(getattr(spec, "build", None)):
            raise TypeError(f"spec must have a build() method returning a backend, got {type(spec).__name__}")
        self.num_shards = check_int("num_shards", num_shards, minimum=1)
        self.max_rebuilds = check_int("max_rebuilds", max_rebuilds, minimum=0)
        self.executor = InProcessExecutor() if executor is None else executor
        self._begun = False
        self._bounds = [(0, 0)] * self.num_shards
        self._rebuilds = [0] * self.num_shards
        try:
            infos = self.executor.start(spec, self.num_shards)
            if any(info != infos[0] for info in infos):
                raise ValueError("the shards' backends disagree on the vocabulary, eos token or transforms")
            self._info = infos[0]
            codec = getattr(spec, "codec", None)
            self._codec = codec() if callable(codec) else None
        except BaseException:
            self.executor.close()
            raise
        self._prompts: list = [[] for _ in range(self.num_shards)]
        self._prefix = None
        self._dropped: list[np.ndarray] = [np.zeros(0, np.int64)] * self.num_shards
        self._active: list[np.ndarray] = [np.zeros(0, np.int64)] * self.num_shards
        self._tokens: list[int] = []

    # -- the executor's calls ------------------------------------------------------------------------------
    def _where(self, shard: int, bounds=None) -> str:
        lo, hi = (self._bounds if bounds is None else bounds)[shard]
        return f"shard {shard} (teachers {lo} to {hi - 1})" if hi > lo else f"shard {shard}"

    def _fan_out(self, method: str, calls: dict, bounds=None) -> dict:
        """``method(*calls[k])`` on every shard ``k`` of ``calls`` at once; the results by shard (``bounds``:
        the teacher ranges that error messages name, default this run's)."""
        handles = {k: self.executor.submit(k, method, *args) for k, args in calls.items()}
        return {k: self._result(k, method, handle, calls[k], bounds) for k, handle in handles.items()}

    def _result(self, shard: int, method: str, handle, args, bounds=None):
        while True:
            try:
                return self.executor.result(handle)
            except WorkerLostError:
                self._rebuild(shard)
                handle = self.executor.submit(shard, method, *args)
            except Exception as exc:
                raise _in_shard(exc, f"{self._where(shard, bounds)}: {method} failed") from exc

    def _call(self, shard: int, method: str, *args):
        return self._fan_out(method, {shard: args})[shard]

    def _rebuild(self, shard: int) -> None:
        """A new worker for ``shard``, brought to the shard's state in this run (module docstring)."""
        while True:
            self._rebuilds[shard] += 1
            count = self._rebuilds[shard]
            if count > self.max_rebuilds:
                raise ShardLostError(f"shard {shard}: its worker was lost {count} times in this run, more than "
                                     f"max_rebuilds={self.max_rebuilds}; giving up")
            _log.warning("shard %d: worker lost; rebuilding it (%d of at most %d in this run)", shard, count,
                         self.max_rebuilds)
            try:
                info = self.executor.restart(shard)
                if info != self._info:
                    raise RuntimeError(f"shard {shard}: the rebuilt backend differs from the others")
                lo, hi = self._bounds[shard]
                if self._begun and hi > lo:
                    handle = self.executor.submit(shard, "replay", self._prompts[shard], self._prefix, lo,
                                                  self._dropped[shard], list(self._tokens))
                    active = np.asarray(self.executor.result(handle))
                    if not np.array_equal(active, self._active[shard]):
                        raise RuntimeError(f"shard {shard}: the rebuilt worker's teachers differ from the shard's")
                return
            except WorkerLostError:
                continue
            except (RuntimeError, ValueError, TypeError) as exc:
                if isinstance(exc, ShardLostError):
                    raise
                raise _in_shard(exc, f"{self._where(shard)}: rebuilding the worker failed") from exc

    @property
    def rebuilds(self) -> list[int]:
        """How often each shard's worker was rebuilt in this run."""
        return list(self._rebuilds)

    def _check_started(self) -> None:
        if not self._begun:
            raise RuntimeError("call begin(teacher_prompts) first")

    def _live(self) -> list[int]:
        return [k for k in range(self.num_shards) if self._active[k].size]

    # -- tokens --------------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._info["vocab_size"]

    @property
    def eos_token_id(self) -> int | None:
        return self._info["eos_token_id"]

    @property
    def temperature(self):
        """The shards' own temperature (that of their ``distributions()``; the generator requires 1.0)."""
        return self._info["temperature"]

    @property
    def top_p(self):
        return self._info["top_p"]

    def encode(self, text: str) -> list[int]:
        return self._codec.encode(text) if self._codec is not None else self._call(0, "encode", text)

    def decode(self, token_ids: Sequence[int]) -> str:
        ids = [int(t) for t in token_ids]
        return self._codec.decode(ids) if self._codec is not None else self._call(0, "decode", ids)

    # -- protocol ------------------------------------------------------------------------------------------
    def _split(self, teacher_prompts) -> list:
        if isinstance(teacher_prompts, str) or not isinstance(teacher_prompts, Sequence):
            raise TypeError("teacher_prompts must be a list of prompts (strings or token-id lists)")
        if len(teacher_prompts) == 0:
            raise ValueError("teacher_prompts must hold at least one teacher prompt")
        return shard_bounds(len(teacher_prompts), self.num_shards)

    def check_prompts(self, teacher_prompts, shared_prefix=None) -> None:
        """Each shard checks its prompts as its backend's ``begin`` would (if it can: ``check_prompts``),
        without running the model; the error names the shard (indices in its message count from the shard's
        first teacher)."""
        bounds = self._split(teacher_prompts)
        self._fan_out("check_prompts", {k: (list(teacher_prompts[lo:hi]), shared_prefix)
                                        for k, (lo, hi) in enumerate(bounds) if hi > lo}, bounds)

    def begin(self, teacher_prompts, shared_prefix=None) -> None:
        """Start a run: shard ``k`` gets its contiguous range of teachers (module docstring); prompts go to the
        workers here, once."""
        bounds = self._split(teacher_prompts)
        self._begun = False
        self._bounds = bounds
        self._prompts = [list(teacher_prompts[lo:hi]) for lo, hi in bounds]
        self._prefix = shared_prefix
        self._tokens = []
        self._rebuilds = [0] * self.num_shards
        self._dropped = [np.zeros(0, np.int64) for _ in bounds]
        self._active = [np.arange(hi - lo, dtype=np.int64) for lo, hi in bounds]
        self._fan_out("begin", {k: (self._prompts[k], shared_prefix, lo)
                                for k, (lo, hi) in enumerate(bounds) if hi > lo})
        self._begun = True

    @property
    def num_teachers(self) -> int:
        self._check_started()
        return self._bounds[-1][1]

    def active_teachers(self) -> np.ndarray:
        self._check_started()
        return np.concatenate([lo + active for (lo, _), active in zip(self._bounds, self._active)])

    def votes(self, key, *, temperature: float = 1.0, top_p: float | None = None, histograms: str = "coordinated",
              teacher_ids=None, public=None) -> np.ndarray:
        """Every shard's votes on ``key``, concatenated in the order of :meth:`active_teachers`; each shard keys
        Cold PATE by its teachers' original indices (or by the matching slice of ``teacher_ids``).  ``public``
        (a :class:`~ensembles.public_prior.PublicPrior`, optional) goes to every shard with the key: each applies
        the same public mixing and support to its own teachers."""
        self._check_started()
        if not isinstance(key, StepKey):
            raise TypeError(f"key must be a StepKey, got {type(key).__name__}")
        check_histograms(histograms)
        live = self._live()
        if not live:
            raise RuntimeError("no active teachers left")
        slices = {k: None for k in live}
        if teacher_ids is not None:
            ids = np.asarray(teacher_ids)
            total = sum(self._active[k].size for k in live)
            if ids.shape != (total,):
                raise ValueError(f"teacher_ids must hold one index per active teacher ({total}), got {ids.shape}")
            starts = np.cumsum([0] + [self._active[k].size for k in live])
            slices = {k: ids[starts[j]:starts[j + 1]] for j, k in enumerate(live)}
        extra = () if public is None else (public,)
        out = self._fan_out("votes", {k: (key, temperature, top_p, histograms, slices[k], *extra) for k in live})
        for k in live:
            if np.shape(out[k]) != (self._active[k].size,):
                raise RuntimeError(f"{self._where(k)}: votes returned the wrong number of votes")
        return np.concatenate([out[k] for k in live]).astype(np.int32, copy=False)

    def append(self, token_id: int) -> None:
        """Broadcast the released token to the shards with active teachers."""
        self._check_started()
        if isinstance(token_id, bool) or not isinstance(token_id, (int, np.integer)):
            raise TypeError(f"token_id must be an integer, got {type(token_id).__name__}")
        token_id = int(token_id)
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} is outside [0, {self.vocab_size})")
        self._mutate("append", {k: (token_id,) for k in self._live()})
        self._tokens.append(token_id)

    def drop_teachers(self, indices) -> None:
        """Remove teachers (original indices) from later steps, each on the shard that owns it."""
        self._check_started()
        n = self.num_teachers
        drop = np.asarray(sorted({int(i) for i in indices}), dtype=np.int64)
        if drop.size and (drop.min() < 0 or drop.max() >= n):
            raise ValueError(f"teacher indices must lie in [0, {n})")
        calls = {}
        for k, (lo, hi) in enumerate(self._bounds):
            local = drop[(drop >= lo) & (drop < hi)] - lo
            local = local[np.isin(local, self._active[k])]
            if local.size:
                calls[k] = (local,)
        self._mutate("drop_teachers", calls)
        for k, (local,) in calls.items():
            self._dropped[k] = np.union1d(self._dropped[k], local)
            self._active[k] = np.setdiff1d(self._active[k], local)

    def _mutate(self, method: str, calls: dict) -> None:
        """A state-changing fan-out: if a shard refuses, the shards disagree, so the run is over."""
        try:
            self._fan_out(method, calls)
        except Exception:
            self._begun = False
            raise

    def distributions(self) -> TeacherDistributions:
        """The active teachers' distributions, gathered from the shards (only when a caller asks)."""
        self._check_started()
        live = self._live()
        if not live:
            raise RuntimeError("no active teachers left")
        out = self._fan_out("distributions", {k: () for k in live})
        return concat_distributions([out[k] for k in live])

    def next_token_distributions(self, contexts) -> TeacherDistributions:
        """Stateless form: the contexts split into contiguous chunks over the shards."""
        contexts = list(contexts)
        if not contexts:
            raise ValueError("contexts must hold at least one context")
        bounds = shard_bounds(len(contexts), self.num_shards)
        calls = {k: (contexts[lo:hi],) for k, (lo, hi) in enumerate(bounds) if hi > lo}
        out = self._fan_out("next_token_distributions", calls)
        return concat_distributions([out[k] for k in sorted(calls)])

    # -- lifetime ------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the workers (a Ray executor's actors; Ray itself if the executor started it)."""
        self._begun = False
        self._prompts, self._tokens = [[] for _ in range(self.num_shards)], []
        self.executor.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _in_shard(exc: Exception, where: str) -> Exception:
    """``exc`` again, its message prefixed with ``where`` (same type when it takes a message)."""
    message = f"{where}: {exc}"
    try:
        return type(exc)(message)
    except Exception:
        return RuntimeError(message)
