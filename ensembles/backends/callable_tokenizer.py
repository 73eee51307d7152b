"""The tokenizer side that the API backends share (:mod:`.openai_api`, :mod:`.sampled_api`): they have no tokenizer
of their own, only a vocabulary size, an end-of-sequence id and an ``encode`` callable given when they are built
(:class:`CallableTokenizer`).  Each keeps its own ``decode``: the two hand their callables the ids differently."""

from __future__ import annotations


class CallableTokenizer:
    """``vocab_size``, ``eos_token_id`` and ``encode`` of the protocol (:mod:`ensembles.backends.base`), from what
    the backend set when it was built: ``_vocab_size``, ``_eos`` (an id, or ``None``) and ``_encode`` (a callable
    returning token ids, or ``None``: prompts are then token-id lists, and :meth:`encode` raises ``TypeError``
    saying :attr:`_NO_ENCODE`)."""

    _vocab_size: int
    _eos: int | None = None
    _encode = None
    #: What :meth:`encode` says when the backend has nothing to encode text with (the backend's own words).
    _NO_ENCODE = "this backend has no encode: give prompts as token-id lists"

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eos_token_id(self) -> int | None:
        return self._eos

    def encode(self, text: str) -> list[int]:
        if self._encode is None:
            raise TypeError(self._NO_ENCODE)
        return [int(t) for t in self._encode(text)]
