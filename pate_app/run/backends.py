"""Where a run's models come from and run: the model's path (:func:`_resolve_model`; ``embedded``, the shipped
SmolLM2 converted once: :func:`demo_model_path`), the teachers' and the public model's backends in this process
or as Ray actors (:func:`_backends`, :func:`_public_backend`, loaded under :func:`loading_model`), and the checks
of ``--workers`` and ``--ray-address`` made before anything is written (:func:`check_workers`,
:func:`parse_ray_address`, :func:`probe_ray_address`)."""

from __future__ import annotations

import contextlib
import importlib.util
import ipaddress
import os
import re
import socket
import sys
from pathlib import Path

from ensembles.backends import transformers_backend as tb
from ensembles.backends.sharded import (
    BackendSpec,
    RayExecutor,
    ShardedBackend,
    TransformersSpec,
)
from ensembles.backends.transformers_backend import TransformersBackend
from pate_app.errors import RunInputError, first_line
from pate_app.library_output import quiet_libraries
from pate_app.options import DEFAULT_RAY_TIMEOUT
from pate_app.spec import model_label

__all__ = ["check_workers", "demo_model_path", "loading_model", "parse_ray_address", "probe_ray_address"]


#: A host name of ``--ray-address``: DNS labels, or an IPv4 address (an IPv6 address goes in brackets).
_HOST = re.compile(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}"
                   r"[A-Za-z0-9])?)*")


_ADDRESS = re.compile(r"(?P<scheme>ray://)?(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:/\[\]]+)):(?P<port>[0-9]+)")


def _ray_installed() -> bool:
    return importlib.util.find_spec("ray") is not None


def parse_ray_address(address) -> tuple[str, int] | None:
    """``(host, port)`` of a ``--ray-address`` ``HOST:PORT`` or ``ray://HOST:PORT``; ``None`` for ``local`` and
    ``auto``.  A :class:`RunInputError` naming ``--ray-address`` for anything else (a port outside 1..65535, a
    host that is no DNS name or IP address)."""
    if address in ("local", "auto"):
        return None
    form = "--ray-address must be 'local', 'auto', HOST:PORT or ray://HOST:PORT"
    match = _ADDRESS.fullmatch(address) if isinstance(address, str) else None
    if match is None:
        raise RunInputError(f"{form}, got {address!r}")
    port = int(match["port"])
    if not 1 <= port <= 65535:
        raise RunInputError(f"--ray-address {address}: the port must lie in 1..65535, got {port}")
    if match["ipv6"] is not None:
        try:
            ipaddress.IPv6Address(match["ipv6"])
        except ValueError:
            raise RunInputError(f"--ray-address {address}: {match['ipv6']!r} is not an IPv6 address") from None
        return match["ipv6"], port
    if not _HOST.fullmatch(match["host"]):
        raise RunInputError(f"{form}, got {address!r} (the host must be a DNS name or an IP address)")
    return match["host"], port


def probe_ray_address(address: str, timeout: float) -> None:
    """Open (and close) a TCP connection to the host and port of ``--ray-address`` within ``timeout`` seconds, so
    that an address nobody answers on is refused at once, before the ledger is claimed, instead of Ray retrying
    for many minutes; ``local`` and ``auto`` are not probed."""
    where = parse_ray_address(address)
    if where is None:
        return
    try:
        with socket.create_connection(where, timeout=timeout):
            pass
    except (OSError, ValueError) as exc:
        reason = "no answer" if isinstance(exc, TimeoutError) else (getattr(exc, "strerror", None) or str(exc))
        raise RunInputError(f"--ray-address {address}: cannot reach {where[0]}:{where[1]} within --ray-timeout "
                            f"{timeout:g} s ({reason})") from None


def check_workers(workers: int, num_teachers: int, ray_address: str | None,
                  ray_timeout: float = DEFAULT_RAY_TIMEOUT) -> None:
    """Refuse, before anything is written: ``--workers`` that is not a positive integer or exceeds
    ``--teachers`` (every shard needs a teacher), a malformed ``--ray-address``, ``--ray-address`` without
    Ray installed, or a cluster address that does not answer within ``ray_timeout`` seconds."""

    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise RunInputError(f"--workers must be a positive integer, got {workers!r}")
    if workers > num_teachers:
        raise RunInputError(f"--workers {workers} exceeds --teachers {num_teachers}: every worker needs at least "
                            "one teacher")
    if ray_address is None:
        return
    if isinstance(ray_timeout, bool) or not isinstance(ray_timeout, (int, float)) or not 0 < ray_timeout <= 600:
        raise RunInputError(f"--ray-timeout must be a number of seconds in (0, 600], got {ray_timeout!r}")
    parse_ray_address(ray_address)
    if not _ray_installed():
        raise RunInputError(f"--ray-address {ray_address}: Ray is not installed; install the distributed extra: "
                            "pip install 'pate-accountant[distributed]'")
    probe_ray_address(ray_address, float(ray_timeout))


def _backends(stack: contextlib.ExitStack, model, threads, workers: int, ray_address: str | None):
    """The teachers' backend and the public fallback backend (closed by ``stack``).

    One worker and no Ray: today's single :class:`TransformersBackend`.  ``workers > 1`` in this process: the
    model is loaded once and shared by ``workers`` shards (:class:`ShardedBackend`).  Ray: every actor loads
    the model itself (``TransformersSpec``), the coordinator keeps only the tokenizer, and the public
    fallback is one more actor."""

    if ray_address is None and workers == 1:
        backend = TransformersBackend(model, threads=threads, top_p=None, temperature=1.0)  # ValueError: bad path
        return backend, TransformersBackend(backend.model, backend.tokenizer, threads=threads)
    if ray_address is None:
        base = TransformersBackend(model, threads=threads, top_p=None, temperature=1.0)
        backend = ShardedBackend(BackendSpec(TransformersBackend, base.model, base.tokenizer, threads=threads),
                                 workers)
        stack.callback(backend.close)
        return backend, TransformersBackend(base.model, base.tokenizer, threads=threads)
    spec = TransformersSpec.for_model(model, threads=threads)  # ValueError: bad path, before Ray starts
    executor = RayExecutor(ray_address)
    try:  # what fails here is the address, not the model (issue 22, item 12)
        executor.connect()
    except (ConnectionError, TimeoutError, ValueError, RuntimeError) as exc:
        raise RunInputError(f"--ray-address {ray_address}: cannot connect to the Ray cluster: {first_line(exc)}"
                            ) from None
    stack.callback(executor.close)  # closed last: it started Ray, if one was started
    try:
        backend = ShardedBackend(spec, workers, executor=executor)
        stack.callback(backend.close)
        public = ShardedBackend(spec, 1, executor=RayExecutor(ray_address))
        stack.callback(public.close)
    except (ConnectionError, TimeoutError) as exc:  # no room on the cluster, actors that never started
        raise RunInputError(f"--ray-address {ray_address}: the Ray cluster did not start the workers: {exc}") from None
    return backend, public


def _public_backend(model, threads):
    """The public model of a ``--public-only`` run: one backend, no teacher."""
    return TransformersBackend(model, threads=threads)


@contextlib.contextmanager
def loading_model(announce: bool):
    """Around the loading of a run's model (:func:`_backends`, :func:`_public_backend`): with ``announce``, one
    line on stderr says so; the libraries' own output is silenced; a model that does not load (unreadable weights,
    a broken config file) is a usage error in one line, no traceback."""
    if announce:
        print("pate-accountant: loading the model ...", file=sys.stderr, flush=True)
    with quiet_libraries(drop_stderr=True):
        try:
            yield
        except OSError as exc:
            raise RunInputError(f"--model: cannot load the model: {first_line(exc)}") from None


def _resolve_model(spec, *, announce: bool) -> tuple:
    """``(model folder or file, its label)``: ``embedded`` converted once into its cache folder, else the local
    path ``spec.model``, which must exist (model hubs are not used)."""
    if spec.model == "embedded":
        try:
            return demo_model_path(announce=announce), model_label("embedded")
        except ValueError as exc:
            raise RunInputError(f"argument --model: {exc}") from None
        except OSError as exc:  # a cache folder that cannot be written (a read-only home)
            raise RunInputError(f"argument --model: cannot convert the embedded model into its cache folder: "
                                f"{exc.strerror or exc} ({exc.filename or ''}; set PATE_ACCOUNTANT_CACHE to a "
                                "writable folder)") from None
    model = os.path.expanduser(spec.model)
    if not os.path.exists(model):
        raise RunInputError(f"argument --model: model path {spec.model!r} does not exist (model hubs are not used: "
                            "give a local folder or .gguf file, or 'embedded')")
    return model, model_label(model)


def demo_model_path(announce: bool = True) -> Path:
    """The embedded SmolLM2 as a converted safetensors folder (converting the GGUF once; with ``announce``, a
    one-line message on stderr says so, and nothing else is printed: transformers' own conversion bars are
    silenced)."""
    gguf = tb.smollm2_path()
    cached = tb.converted_gguf_path(gguf)
    if announce and not (cached / "config.json").is_file():
        print("pate-accountant: converting the embedded SmolLM2 model once (about 20 s; cached in "
              f"{tb.default_cache_dir()})", file=sys.stderr, flush=True)
    with quiet_libraries(drop_stderr=True):
        return tb.convert_gguf(gguf)
