"""Signed checkpoints of a ledger: its head, signed with an Ed25519 key the run operator holds (docs/ledger.md).

The hash chains of :mod:`pate_accountant.ledger` are keyless: whoever can write the file can rebuild a
consistent history (a lowered epsilon, dropped rows, a raised budget, another file) and :meth:`Ledger.verify`
accepts it.  A checkpoint fixes the history up to a point outside the file's control:

* the **statement** is the shareable ledger's identity and heads (ledger id, data set, accountant
  configuration with its budget, row count and last row hash, run count and last run hash), the time of
  signing and the signer's key id.  It holds nothing the shareable file does not already hold: no teacher set,
  no confidential hash, no seed;
* the **signature** is Ed25519 over ``"pate-accountant signed checkpoint v1\\n" + canonical JSON of the
  statement`` (a domain-separation prefix, so the signature can never be read as a signature of anything else);
* a ledger **extends** a checkpoint when it has the same ledger id, at least the signed number of rows and runs,
  and its row ``rows`` and run ``runs`` carry the signed hashes (each hash covers every row or run before it).

Checkpoints are kept one per line (JSON Lines) in a file beside the ledger, ``PATH.checkpoints.jsonl`` by
default (:func:`default_checkpoints_path`), which the operator hands to an auditor with the public key, or
publishes.  :func:`check_checkpoints` is what ``pate-accountant audit --public-key`` does: every checkpoint
must carry a valid signature by the given key and be extended by the ledger, and there must be at least one.

What a signature cannot do: the key holder can sign any history, a forged one included (see the threat-model
table in docs/ledger.md), and a checkpoint says nothing of rows written after it.  A forger without the key
who deletes the newest checkpoints from the file leaves the older ones, so the auditor should compare the
count and newest checkpoint with a copy kept elsewhere.

Ed25519 comes from ``cryptography`` (the optional ``signing`` extra), imported only when a key is used; keys
are PEM files in the usual formats (PKCS #8 private key, SubjectPublicKeyInfo public key), so
``openssl genpkey -algorithm ed25519`` keys work too.  A private key file written here is readable by its owner
only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import stat
import time
from pathlib import Path

import attr

from pate_accountant import __version__
from pate_accountant.errors import PateAccountantError
from pate_accountant.serialization import canonical_json, describe_difference

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_VERSION",
    "CheckpointError",
    "CheckpointsResult",
    "append_checkpoint",
    "check_checkpoints",
    "checkpoint_problem",
    "checkpoints_file",
    "default_checkpoints_path",
    "generate_key",
    "history_problem",
    "key_id",
    "load_private_key",
    "load_public_key",
    "read_checkpoints",
    "sign_checkpoint",
    "verify_signature",
]

#: The ``format`` field of every checkpoint, and with :data:`CHECKPOINT_VERSION` the signed prefix.
CHECKPOINT_FORMAT = "pate-accountant signed checkpoint"
CHECKPOINT_VERSION = 1
#: The fields of a checkpoint statement (what the signature covers), in a fixed set.
STATEMENT_KEYS = ("format", "version", "ledger_id", "dataset", "config", "rows", "head_hash", "runs",
                  "run_head_hash", "signed_at", "software_version", "key_id")
#: Where checkpoints are kept by default: beside the ledger.
CHECKPOINTS_SUFFIX = ".checkpoints.jsonl"
_INSTALL = "pip install 'pate-accountant[signing]' (or: pip install cryptography)"
#: The most bytes read from a key file: an Ed25519 PEM key is about 120 bytes; a larger file is not a key.
MAX_KEY_BYTES = 8192
#: The longest line of a checkpoints file (bytes): a checkpoint is about 1 KB (its config the largest part).
MAX_CHECKPOINT_LINE = 65536
#: How much earlier than the ledger's creation a checkpoint may say it was signed (seconds): the signer's and the
#: writer's clocks may differ a little when the ledger is signed on another machine.
SIGNED_AT_SKEW_S = 600.0
_CLOCKS = (f", or the signing host's clock is more than {SIGNED_AT_SKEW_S:g} s behind the clock of the host that "
           "wrote that time (hosts sharing a ledger need clocks that agree within that: docs/ledger.md, \"Clocks\")")
_HEX = frozenset("0123456789abcdef")


class CheckpointError(PateAccountantError):
    """A key or checkpoint that cannot be used: missing library, unreadable key, bad signature, malformed line."""


def _ed25519():
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise CheckpointError(f"signed checkpoints need the cryptography package: {_INSTALL}") from None
    return ed25519, serialization


def _public_bytes(public_key) -> bytes:
    _, serialization = _ed25519()
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(public_key) -> str:
    """A short name of a public key: the first 16 hexadecimal digits of SHA-256 of its 32 raw bytes."""
    return hashlib.sha256(_public_bytes(public_key)).hexdigest()[:16]


def default_checkpoints_path(ledger_path) -> str:
    """``PATH.checkpoints.jsonl``: where a ledger's signed checkpoints are kept unless told otherwise."""
    return os.fspath(ledger_path) + CHECKPOINTS_SUFFIX


def generate_key(path, public_path=None) -> tuple[str, str]:
    """Write a new Ed25519 private key to ``path`` (PEM, PKCS #8, unencrypted, mode 0600) and its public key to
    ``public_path`` (default ``path + ".pub"``); refuse to overwrite either, and refuse one path for both.
    Returns both paths.  Either both files are written or neither is (a failure removes the private key it wrote).
    Keep the private key away from the ledger's machine if you can: whoever holds it can sign any history."""
    ed25519, serialization = _ed25519()
    path = Path(os.fspath(path))
    public_path = Path(os.fspath(public_path)) if public_path is not None else Path(f"{path}.pub")
    if path.resolve() == public_path.resolve():
        raise CheckpointError(f"public key file {str(public_path)!r} is the private key file: give the public key "
                              "another path (default KEY.pub)")
    for name, where in (("key", path), ("public key", public_path)):
        if where.exists() or where.is_symlink():
            raise CheckpointError(f"{name} file {str(where)!r} exists: not overwritten")
        if not where.parent.is_dir():
            raise CheckpointError(f"{name} file {str(where)!r}: no folder {str(where.parent)!r}")
    key = ed25519.Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    written = None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        written = path
        with os.fdopen(fd, "wb") as handle:
            os.chmod(path, 0o600)  # whatever the umask
            handle.write(private_pem)
        with open(public_path, "xb") as handle:
            handle.write(public_pem)
    except OSError as exc:  # created meanwhile, no permission, a full disk: no half-made key pair is left
        if written is not None:
            with contextlib.suppress(OSError):
                os.unlink(written)
        where = exc.filename if exc.filename is not None else path
        raise CheckpointError(f"cannot write the key pair ({str(where)!r}: {exc.strerror or exc}); nothing was "
                              "written") from None
    return str(path), str(public_path)


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _open_regular(where: str, what: str):
    """A binary reader of the regular file ``where``; :class:`CheckpointError` (one line naming ``what``) for a
    missing file and for anything that is not a regular file (a device such as ``/dev/zero``, a FIFO, a folder),
    which is refused before it is opened (a FIFO would block the open, a device never end); the open itself does
    not block either, and the opened file is checked again."""
    try:
        info = os.stat(where)
    except OSError as exc:
        raise CheckpointError(f"{what} {where!r}: cannot read it ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        raise CheckpointError(f"{what} {where!r} is {_file_kind(info.st_mode)}, not a regular file: refused")
    try:
        fd = os.open(where, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise CheckpointError(f"{what} {where!r}: cannot read it ({exc.strerror or exc})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # replaced between the two looks
        os.close(fd)
        raise CheckpointError(f"{what} {where!r} is {_file_kind(info.st_mode)}, not a regular file: refused")
    return os.fdopen(fd, "rb")


def _load_key(path, what: str, kind: str):
    """The Ed25519 key of ``kind`` (``"private"`` or ``"public"``) in the PEM file ``path``; ``what`` names it in
    errors."""
    ed25519, serialization = _ed25519()
    if kind == "private":
        wanted = ed25519.Ed25519PrivateKey
        block = "an unencrypted PEM private key (a '-----BEGIN PRIVATE KEY-----' block)"

        def load(data):
            return serialization.load_pem_private_key(data, password=None)
    else:
        wanted, block = ed25519.Ed25519PublicKey, "a PEM public key (a '-----BEGIN PUBLIC KEY-----' block)"
        load = serialization.load_pem_public_key
    where = os.fspath(path)
    with _open_regular(where, what) as handle:
        try:
            data = handle.read(MAX_KEY_BYTES + 1)  # never more: a key is a few hundred bytes
        except OSError as exc:
            raise CheckpointError(f"{what} {where!r}: cannot read it ({exc.strerror or exc})") from None
    if len(data) > MAX_KEY_BYTES:
        raise CheckpointError(f"{what} {where!r} is larger than {MAX_KEY_BYTES} bytes, so not {block}")
    from cryptography.exceptions import UnsupportedAlgorithm

    try:
        key = load(data)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise CheckpointError(f"{what} {where!r} is not {block}") from None
    if not isinstance(key, wanted):
        raise CheckpointError(f"{what} {where!r} is a {type(key).__name__}, not an Ed25519 key")
    return key


def load_private_key(path):
    """The Ed25519 private key in the PEM file ``path`` (an unencrypted PKCS #8 key, as :func:`generate_key` or
    ``openssl genpkey -algorithm ed25519`` write it)."""
    return _load_key(path, "signing key", "private")


def load_public_key(path):
    """The Ed25519 public key in the PEM file ``path`` (SubjectPublicKeyInfo)."""
    return _load_key(path, "public key", "public")


def checkpoints_file(ledger_path, given=None) -> Path:
    """The checkpoints file a signer appends to: ``given``, else :func:`default_checkpoints_path`; refused
    (:class:`CheckpointError`) when its folder is missing, when it is a folder or no regular file (a device such
    as ``/dev/full``, a FIFO), or when it cannot be written, before anything is signed or charged."""
    where = Path(os.fspath(given) if given is not None else default_checkpoints_path(ledger_path))
    if not where.parent.is_dir():
        raise CheckpointError(f"cannot append to {str(where)!r}: no folder {str(where.parent)!r}")
    if where.is_dir():
        raise CheckpointError(f"cannot append to {str(where)!r}: it is a folder")
    if where.exists() and not where.is_file():  # a device (/dev/full), a FIFO: it would fail or hang at the end
        raise CheckpointError(f"cannot append to {str(where)!r}: it is {_file_kind(where.stat().st_mode)}, "
                              "not a regular file")
    if not os.access(where if where.exists() else where.parent, os.W_OK):
        raise CheckpointError(f"cannot append to {str(where)!r}: no permission to write "
                              f"{'it' if where.exists() else 'into ' + repr(str(where.parent))}")
    return where


def _signed_bytes(statement: dict) -> bytes:
    return f"{CHECKPOINT_FORMAT} v{CHECKPOINT_VERSION}\n".encode() + canonical_json(statement).encode("utf-8")


def sign_checkpoint(ledger, private_key, *, verification=None, at_run_start: bool = False) -> dict:
    """A signed checkpoint of ``ledger``'s current head (a dict: the statement plus ``signature``, hex).

    The ledger must verify: ``verification`` is a :class:`~pate_accountant.ledger.VerificationResult` the caller
    has just computed (a run's own end-of-run audit), else :meth:`Ledger.verify` runs here.  A ledger that does
    not verify, or whose head moved past the verification, is refused: a signature vouches for a verified
    history only.

    ``signed_at`` is now, or with ``at_run_start`` the start of the last run the statement covers (the ledger's
    creation when it covers none): a run that signs its own end passes it, so that the shareable checkpoint does
    not tell how long the run took, which depends on the data (issue 22, item 6)."""
    if verification is None:
        verification = ledger.verify()
    if not verification.ok:
        raise CheckpointError(f"the ledger does not verify, so it is not signed: {verification.message}")
    head = ledger.head_record
    if head["rows"] != verification.rows or head["head_hash"] != verification.head_hash:
        raise CheckpointError("the ledger has grown since it was verified: verify it again before signing")
    public = private_key.public_key()
    signed_at = float(time.time())
    if at_run_start:
        started = ledger.runs[head["runs"] - 1]["created"] if head["runs"] else ledger.created
        signed_at = float(started) if isinstance(started, (int, float)) else signed_at
    statement = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "ledger_id": ledger.ledger_id,
        "dataset": ledger.dataset,
        "config": ledger.config,
        **head,
        "signed_at": signed_at,
        "software_version": __version__,
        "key_id": key_id(public),
    }
    signature = private_key.sign(_signed_bytes(statement))
    return {**statement, "signature": signature.hex()}


def verify_signature(checkpoint: dict, public_key) -> None:
    """Raise :class:`CheckpointError` unless ``checkpoint`` is well formed and signed by ``public_key``."""
    _ed25519()
    from cryptography.exceptions import InvalidSignature

    if not isinstance(checkpoint, dict):
        raise CheckpointError("a checkpoint must be a JSON object")
    keys = set(checkpoint) - {"signature"}
    if keys != set(STATEMENT_KEYS):
        missing, extra = sorted(set(STATEMENT_KEYS) - keys), sorted(keys - set(STATEMENT_KEYS))
        raise CheckpointError(f"not a checkpoint of format {CHECKPOINT_VERSION}: missing {missing}, unknown {extra}")
    if checkpoint["format"] != CHECKPOINT_FORMAT or checkpoint["version"] != CHECKPOINT_VERSION:
        raise CheckpointError(f"not a checkpoint of format {CHECKPOINT_VERSION}: format {checkpoint['format']!r}, "
                              f"version {checkpoint['version']!r}")
    if checkpoint["key_id"] != key_id(public_key):
        raise CheckpointError(f"signed by key {checkpoint['key_id']!r}, not by the given key {key_id(public_key)!r}")
    try:
        signature = bytes.fromhex(str(checkpoint["signature"]))
    except ValueError:
        raise CheckpointError("its signature is not hexadecimal") from None
    statement = {key: checkpoint[key] for key in STATEMENT_KEYS}
    try:
        public_key.verify(signature, _signed_bytes(statement))
    except InvalidSignature:
        raise CheckpointError("its signature does not match its content (the checkpoint was edited, or signed "
                              "by another key)") from None


def history_problem(ledger, *, rows: int | None = None, head_hash: str | None = None, runs: int | None = None,
                    run_head_hash: str | None = None, ledger_id: str | None = None,
                    record: str = "recorded") -> str | None:
    """Why ``ledger`` does not extend a history recorded earlier, or ``None`` when it does (``record`` names how
    it was recorded in the reason: ``"recorded"``, or ``"pinned"`` for a pin).

    ``rows``/``head_hash``: the ledger has at least ``rows`` rows and row ``rows`` has hash ``head_hash`` (with
    ``head_hash`` alone: some row has it); ``runs``/``run_head_hash`` the same for runs; ``ledger_id``: it is the
    same ledger.  Each hash covers everything before it, so an extension agrees with the record on every row up
    to it."""
    if ledger_id is not None and ledger.ledger_id != ledger_id:
        return "it is another ledger (another ledger id): the file was replaced"
    have = ledger.head_record
    if rows is not None and have["rows"] < rows:
        return (f"the ledger has {have['rows']} rows, fewer than the {rows} {record}: rows were dropped or the file "
                "replaced")
    if head_hash is not None:
        if rows is not None and rows > 0 and ledger.row_hash(rows) != head_hash:
            return (f"row {rows} does not have the {record} head hash: the history up to it was rewritten or the file "
                    "replaced")
        if rows is None and not any(row.hash == head_hash for row in ledger.rows()):
            return f"no row has the {record} head hash: the ledger does not extend the {record} history"
    if runs is not None and have["runs"] < runs:
        return f"the ledger has {have['runs']} runs, fewer than the {runs} {record}: runs were dropped"
    if run_head_hash is not None:
        if runs is not None and runs > 0 and ledger.run_hash(runs) != run_head_hash:
            return f"run {runs} does not have the {record} hash: the runs up to it were rewritten"
        if runs is None and not any(ledger.run_hash(k) == run_head_hash for k in range(1, have["runs"] + 1)):
            return f"no run has the {record} hash: the runs up to it were rewritten"
    return None


def _is_hash(value) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _malformed(checkpoint: dict) -> str | None:
    """The first field of a (signature-checked) statement that does not have the shape :func:`sign_checkpoint`
    gives it, or ``None``.  Only the key holder can sign a malformed one; it is still refused, never a crash."""
    rows, runs, signed_at = checkpoint["rows"], checkpoint["runs"], checkpoint["signed_at"]
    checks = (
        ("ledger_id", isinstance(checkpoint["ledger_id"], str)),
        ("dataset", checkpoint["dataset"] is None or isinstance(checkpoint["dataset"], str)),
        ("config", checkpoint["config"] is None or isinstance(checkpoint["config"], dict)),
        ("rows", _is_count(rows)),
        ("head_hash", (checkpoint["head_hash"] is None) if rows == 0 else _is_hash(checkpoint["head_hash"])),
        ("runs", _is_count(runs)),
        ("run_head_hash",
         (checkpoint["run_head_hash"] is None) if runs == 0 else _is_hash(checkpoint["run_head_hash"])),
        ("signed_at", isinstance(signed_at, (int, float)) and not isinstance(signed_at, bool)
         and math.isfinite(signed_at)),
        ("software_version", isinstance(checkpoint["software_version"], str) and bool(checkpoint["software_version"])),
    )
    for field, ok in checks:
        if not ok:
            return f"its {field} is malformed ({str(json.dumps(checkpoint[field]))[:80]})"
    return None


def _difference(field: str, signed, have) -> str:
    """What differs between the signed value of ``field`` and the ledger's, one clause."""
    if isinstance(signed, dict) and isinstance(have, dict):
        return describe_difference(have, signed, me="the ledger", them="the checkpoint")
    return f"the ledger has {json.dumps(have)}, the checkpoint {json.dumps(signed)}"


def checkpoint_problem(ledger, checkpoint: dict) -> str | None:
    """Why ``ledger`` does not match the (signature-checked) ``checkpoint``, or ``None``.  Every field of the
    statement is checked against the ledger: ``format``, ``version`` and ``key_id`` by :func:`verify_signature`;
    ``ledger_id``, ``rows``/``head_hash`` and ``runs``/``run_head_hash``: the ledger is that ledger and extends
    those heads; ``dataset`` and ``config`` (accountant and budget): the ledger's are the signed ones (a ``null``
    one was not set when signed, and the ledger lets each be set once, before its first row); ``signed_at``: a
    time not before the ledger's creation (:data:`SIGNED_AT_SKEW_S` allowed for the clocks) nor before the start
    of the last signed run; ``software_version``: the signer's version, a non-empty string (it names the program
    that signed, not the ledger's)."""
    problem = _malformed(checkpoint)
    if problem is not None:
        return problem
    problem = history_problem(ledger, rows=checkpoint["rows"], head_hash=checkpoint["head_hash"],
                              runs=checkpoint["runs"], run_head_hash=checkpoint["run_head_hash"],
                              ledger_id=checkpoint["ledger_id"])
    if problem is not None:
        return problem
    for field, have in (("dataset", ledger.dataset), ("config", ledger.config)):
        signed = checkpoint[field]
        if signed is not None and signed != have:
            return (f"its {field} is not the signed one ({_difference(field, signed, have)}): the ledger's {field} "
                    "was changed after it was signed")
    signed_at = checkpoint["signed_at"]
    created = ledger.created
    if isinstance(created, (int, float)) and signed_at < created - SIGNED_AT_SKEW_S:
        return (f"its signed_at ({signed_at!r}) is before the ledger was created ({created!r}): it was not signed "
                f"for this ledger{_CLOCKS}")
    if checkpoint["runs"]:
        started = ledger.runs[checkpoint["runs"] - 1]["created"]
        if isinstance(started, (int, float)) and signed_at < started - SIGNED_AT_SKEW_S:
            return (f"its signed_at ({signed_at!r}) is before run {checkpoint['runs']} began ({started!r}): it was not "
                    f"signed for this ledger{_CLOCKS}")
    return None


def append_checkpoint(path, checkpoint: dict) -> None:
    """Append ``checkpoint`` as one line to the JSON Lines file ``path`` (created if missing); the file holds
    only what the shareable ledger holds, so it may be published.  A path that is not a regular file (a FIFO, a
    device) is refused without blocking; a failed write is a :class:`CheckpointError`."""
    where = os.fspath(path)
    line = (canonical_json(checkpoint) + "\n").encode("utf-8")
    try:
        info = os.stat(where)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise CheckpointError(f"cannot append to {where!r}: {exc.strerror or exc}") from None
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise CheckpointError(f"cannot append to {where!r}: it is {_file_kind(info.st_mode)}, not a regular file")
    try:
        fd = os.open(where, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NONBLOCK", 0), 0o666)
    except OSError as exc:
        raise CheckpointError(f"cannot append to {where!r}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(f"cannot append to {where!r}: it is {_file_kind(info.st_mode)}, not a regular file")
        written = 0
        while written < len(line):
            written += os.write(fd, line[written:])
        os.fsync(fd)
    except OSError as exc:
        raise CheckpointError(f"cannot append to {where!r}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def read_checkpoints(path) -> list[dict]:
    """Every checkpoint in the JSON Lines file ``path``, in order (not verified: :func:`check_checkpoints`).  The
    file must be a regular file (a FIFO or a device is refused before it is opened) whose lines are at most
    :data:`MAX_CHECKPOINT_LINE` bytes long; anything else is a one-line :class:`CheckpointError`."""
    where = os.fspath(path)
    if not os.path.lexists(where):
        raise CheckpointError(f"no checkpoints file at {where!r}")
    out = []
    with _open_regular(where, "checkpoints file") as handle:
        number = 0
        while True:
            try:
                chunk = handle.readline(MAX_CHECKPOINT_LINE + 1)
            except OSError as exc:
                raise CheckpointError(f"checkpoints file {where!r}: cannot read it ({exc.strerror or exc})") from None
            if not chunk:
                break
            number += 1
            if len(chunk) > MAX_CHECKPOINT_LINE and not chunk.endswith(b"\n"):
                raise CheckpointError(f"checkpoints file {where!r}, line {number}: longer than {MAX_CHECKPOINT_LINE} "
                                      "bytes, so not a checkpoint")
            try:
                line = chunk.decode("utf-8")
            except UnicodeDecodeError:
                raise CheckpointError(f"checkpoints file {where!r}, line {number}: not UTF-8 text") from None
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise CheckpointError(f"checkpoints file {where!r}, line {number}: not JSON ({exc.msg})") from None
            except RecursionError:
                raise CheckpointError(f"checkpoints file {where!r}, line {number}: not JSON (nested too deeply)"
                                      ) from None
    return out


@attr.frozen
class CheckpointsResult:
    """What :func:`check_checkpoints` found: ``ok``; ``message``; ``count`` checkpoints checked; ``key_id`` of the
    given key; ``covered_rows`` (the most rows a valid checkpoint covers) of ``rows``; ``first_bad`` (the 1-based
    line of the first checkpoint that fails, or ``None``)."""

    ok: bool
    message: str
    count: int
    key_id: str
    covered_rows: int
    rows: int
    first_bad: int | None = None

    def as_dict(self) -> dict:
        return attr.asdict(self)


def check_checkpoints(ledger, checkpoints: list, public_key) -> CheckpointsResult:
    """Check that every checkpoint is signed by ``public_key`` and extended by ``ledger`` (one that verifies:
    run :meth:`Ledger.verify` first), and that there is at least one."""
    kid = key_id(public_key)
    rows = ledger.head_record["rows"]
    covered = 0
    if not checkpoints:
        return CheckpointsResult(False, "no signed checkpoint to check the ledger against", 0, kid, 0, rows)
    for number, checkpoint in enumerate(checkpoints, start=1):
        try:
            verify_signature(checkpoint, public_key)
        except CheckpointError as exc:
            return CheckpointsResult(False, f"checkpoint {number} is not valid: {exc}", len(checkpoints), kid,
                                     covered, rows, number)
        problem = checkpoint_problem(ledger, checkpoint)
        if problem is not None:
            message = f"the ledger does not extend signed checkpoint {number} ({checkpoint['rows']} rows): {problem}"
            return CheckpointsResult(False, message, len(checkpoints), kid, covered, rows, number)
        covered = max(covered, int(checkpoint["rows"]))
    tail = "" if covered == rows else f" (rows {covered + 1} to {rows} are not covered by a signature yet)"
    return CheckpointsResult(True, f"{len(checkpoints)} signed checkpoint(s) by key {kid} verified and extended; "
                             f"they cover the first {covered} of {rows} rows{tail}", len(checkpoints), kid, covered,
                             rows)
