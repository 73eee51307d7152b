"""Whole-answer probabilities from a causal LM: teacher-forced scoring of many candidate answers at once.

The paper's Planet Z task (Section 5.2) relies on Llama-3 encoding every 3-digit number as one token, so
a teacher's next-token distribution *is* its distribution over answers.  Smaller tokenizers (SmolLM2's
among them) spell a number digit by digit.  :class:`AnswerScorer` restores the single-token view: for
every teacher it computes the model's probability of each candidate answer string as a whole,

    ``P(answer a) = prod_t P(a_t | context, a_<t) * P(the answer stops | context, a)``,

where "stops" means that the next token is not a *continuation* token (by default: a token whose text
starts with an ASCII digit).  Because every candidate's tokens after the first are continuation tokens,
the events "the reply starts with exactly answer ``a``" are disjoint, so the probabilities of a teacher
sum to at most 1; the rest of its mass (other replies, answers cut by ``min_prob``) is its tail.

How it is computed (one forward per answer depth, no per-candidate copy of the prompt):

* the prompts are prefilled by :class:`~ensembles.backends.transformers_backend.TransformersBackend`
  (``begin``: shared-prefix KV cache, left-padded batches); their last logits give the first tokens;
* the candidates' token sequences form a trie; depth ``d`` of the trie is fed as one packed block per
  batch, appended to the same KV cache, with a 4-d additive attention mask so that each trie node sees
  only its teacher's prompt tokens, its ancestors and itself ("tree attention"), at the position it
  would have in the plain context; the logits of a node give its children's conditional probabilities
  and, for a complete answer, the stop probability;
* a node whose prefix probability is below ``min_prob`` is not expanded: the answers below it go to the
  tail (their exact mass is then unknown but at most the pruned prefix mass).

The result equals the product of next-token probabilities of a plain full-context forward pass on
``context + answer`` (tested against one on a tiny random Llama).  torch is imported inside methods only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ensembles.backends.hf_cache import forward_with_cache
from ensembles.distributions import TeacherDistributions
from pate_accountant.validation import check_real

__all__ = ["AnswerScorer", "digit_continuation"]

#: Rows of logits turned into float64 log-normalisers at once (bounds the float64 copy to ~100 MB).
_LSE_ROWS = 256
#: Teachers prefilled at once, in backend batches (bounds the KV cache memory).
_CHUNK_BATCHES = 4


def digit_continuation(text: str) -> bool:
    """The default continuation rule: a token continues a number when its text starts with a digit 0-9."""
    return text[:1] in "0123456789" and text[:1] != ""


class _Trie:
    """The candidates' token sequences as a trie; node ``v`` has ``token``, ``depth``, ``children``."""

    def __init__(self, sequences: list[tuple[int, ...]]):
        self.token: list[int] = []
        self.depth: list[int] = []
        self.children: list[list[int]] = []
        self.answer: list[int] = []  # candidate index ending at this node, or -1
        self.roots: list[int] = []
        index: dict[tuple[int, ...], int] = {}
        for a, seq in enumerate(sequences):
            parent = None
            for d in range(1, len(seq) + 1):
                key = seq[:d]
                node = index.get(key)
                if node is None:
                    node = len(self.token)
                    index[key] = node
                    self.token.append(seq[d - 1])
                    self.depth.append(d)
                    self.children.append([])
                    self.answer.append(-1)
                    (self.roots if parent is None else self.children[parent]).append(node)
                parent = node
            if self.answer[parent] != -1:
                raise ValueError(f"candidate answers {self.answer[parent]} and {a} have the same tokens")
            self.answer[parent] = a
        self.size = len(self.token)
        self.max_depth = max(self.depth)


class AnswerScorer:
    """Probabilities of whole candidate answers for every teacher prompt (see the module docstring).

    ``backend``: a :class:`~ensembles.backends.transformers_backend.TransformersBackend` (its model,
    tokenizer, device, batch size and temperature are used; ``top_p`` must be unset).  ``answers``: the
    candidate answer strings, encoded without special tokens; every token after an answer's first must be
    a continuation token.  ``min_prob``: prefix probability below which a trie node is not expanded
    (``0``: score every candidate exactly).  ``continues(text) -> bool`` decides which vocabulary tokens
    would continue an answer (default :func:`digit_continuation`).
    """

    def __init__(
        self,
        backend,
        answers: Sequence[str],
        *,
        min_prob: float = 0.0,
        continues: Callable[[str], bool] = digit_continuation,
    ):
        if getattr(backend, "top_p", None) is not None:
            raise ValueError("answer scoring needs untruncated distributions: build the backend with top_p=None")
        answers = list(answers)
        if not answers or not all(isinstance(a, str) and a for a in answers):
            raise ValueError("answers must be a non-empty list of non-empty strings")
        if len(set(answers)) != len(answers):
            raise ValueError("answers must be distinct")
        self.min_prob = check_real("min_prob", min_prob, minimum=0.0, maximum=1.0, max_open=True)
        self.backend = backend
        self.answers = answers
        tokenizer = backend.tokenizer
        texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
        limit = min(len(texts), backend.vocab_size)
        self.continuation_ids = np.array([i for i in range(limit) if continues(texts[i])], dtype=np.int64)
        allowed = set(self.continuation_ids.tolist())
        sequences = []
        for a, text in enumerate(answers):
            seq = tuple(backend.encode(text))
            if not seq:
                raise ValueError(f"candidate answer {text!r} encodes to no tokens")
            if any(t not in allowed for t in seq[1:]):
                raise ValueError(
                    f"candidate answer {text!r}: every token after the first must be a continuation token "
                    "(else the candidates' events are not disjoint)"
                )
            sequences.append(seq)
        self.trie = _Trie(sequences)
        #: trie nodes fed to the model in the last :meth:`score` (summed over teachers): the scoring cost
        self.expanded_nodes = 0

    @property
    def num_answers(self) -> int:
        return len(self.answers)

    # -- scoring ---------------------------------------------------------------------------------------
    def score(self, teacher_prompts, shared_prefix=None, *, progress: Callable[[int], None] | None = None):
        """``(n, num_answers)`` float64 matrix: teacher ``i``'s probability of each candidate answer.

        Teacher ``i``'s context is ``shared_prefix + teacher_prompts[i]`` exactly as in
        :meth:`TransformersBackend.begin`.  Pruned answers (prefix probability below ``min_prob``) are 0.
        The teachers are prefilled in chunks of ``4 * batch_size`` (bounded KV memory); ``progress(k)`` is
        called after each batch of ``k`` teachers.  Afterwards the backend holds the last chunk's prompts.
        """
        if isinstance(teacher_prompts, str) or not isinstance(teacher_prompts, Sequence):
            raise TypeError("teacher_prompts must be a list of prompts (strings or token-id lists)")
        prompts = list(teacher_prompts)
        if not prompts:
            raise ValueError("teacher_prompts must hold at least one teacher prompt")
        backend = self.backend
        out = np.zeros((len(prompts), self.num_answers))
        self.expanded_nodes = 0
        chunk = _CHUNK_BATCHES * backend.batch_size
        for start in range(0, len(prompts), chunk):
            backend.begin(prompts[start : start + chunk], shared_prefix)
            for batch in backend._batches:  # the backend's prefilled batches: cache, mask, positions, logits
                out[start + batch.teachers] = self._score_batch(batch)
                if progress is not None:
                    progress(int(batch.teachers.size))
        return out

    def distributions(self, teacher_prompts, shared_prefix=None, *, progress=None):
        """The teachers' distributions over the candidate answers (token id = answer index), with tails.

        Returns ``(teachers, probs)``: ``teachers`` has ``vocab_size = num_answers`` and tail
        ``1 - sum_a p_ia`` (replies that are no candidate, and pruned candidates); ``probs`` is
        :meth:`score`'s matrix.
        """
        probs = self.score(teacher_prompts, shared_prefix, progress=progress)
        tail = np.clip(1.0 - probs.sum(axis=1), 0.0, None)
        return TeacherDistributions.from_dense(probs, tail=tail), probs

    def _log_normalisers(self, logits):
        """``logsumexp`` over the vocabulary of ``(rows, V)`` logits (float64, in row chunks), temperature applied."""
        import torch

        parts = []
        for start in range(0, logits.shape[0], _LSE_ROWS):
            chunk = logits[start : start + _LSE_ROWS].to(torch.float64) / self.backend.temperature
            parts.append(torch.logsumexp(chunk, dim=-1))
        return torch.cat(parts) if parts else logits.new_zeros(0, dtype=torch.float64)

    def _conditionals(self, logits, columns):
        """``P(token | row context)`` for ``(rows, V)`` logits at the given ``(rows, c)`` columns, and the
        probability that the answer stops (no continuation token) per row; float64 numpy arrays."""
        import torch

        lse = self._log_normalisers(logits)
        cols = torch.as_tensor(columns, dtype=torch.long, device=logits.device)
        picked = torch.gather(logits, 1, cols).to(torch.float64) / self.backend.temperature
        cont = logits[:, torch.as_tensor(self.continuation_ids, device=logits.device)].to(torch.float64)
        cont = cont / self.backend.temperature
        stop = 1.0 - torch.exp(cont - lse[:, None]).sum(dim=1)
        probs = torch.exp(picked - lse[:, None])
        return probs.cpu().numpy(), torch.clamp(stop, min=0.0).cpu().numpy()

    def _score_batch(self, batch) -> np.ndarray:
        """Walk the trie depth by depth on top of one prefilled backend batch; ``(B, num_answers)``."""
        import torch

        backend, trie = self.backend, self.trie
        b = batch.teachers.size
        device, dtype = backend.device, backend.dtype
        decoder = getattr(backend.model, backend.model.base_model_prefix)  # the decoder stack (LlamaModel)
        head = backend.model.get_output_embeddings()
        pad = int(backend.tokenizer.pad_token_id)
        blocked = torch.finfo(dtype).min
        out = np.zeros((b, self.num_answers))
        prefix = np.zeros((b, trie.size))  # prefix probability of each node, per row
        roots = np.asarray(trie.roots, dtype=np.int64)
        prefix[:, roots], _ = self._conditionals(batch.logits, np.tile(np.asarray(trie.token)[roots], (b, 1)))
        floor = max(self.min_prob, np.finfo(np.float64).tiny)
        frontier = [[v for v in trie.roots if prefix[r, v] >= floor] for r in range(b)]
        cache = batch.cache
        prompt_columns = int(batch.mask.shape[1])
        prompt_mask = torch.where(batch.mask[:, None, None, :].cpu() > 0, 0.0, blocked).to(dtype)  # (B, 1, 1, prompt)
        columns = prompt_columns
        seen: dict[tuple[int, int], list[int]] = {}  # (row, node) -> cache columns of its ancestors
        try:
            for depth in range(1, trie.max_depth + 1):
                width = max(len(f) for f in frontier)
                if width == 0:
                    break
                rows = [r for r, f in enumerate(frontier) for _ in f]
                slots = [j for f in frontier for j in range(len(f))]
                nodes = [v for f in frontier for v in f]
                self.expanded_nodes += len(nodes)
                # Tree attention: a node sees its row's prompt, its ancestors and itself; padding sees itself.
                ids = torch.full((b, width), pad, dtype=torch.long)
                mask = torch.full((b, 1, width, columns + width), blocked, dtype=dtype)
                mask[:, :, :, :prompt_columns] = prompt_mask
                for r, j, v in zip(rows, slots, nodes):
                    ids[r, j] = trie.token[v]
                    own = seen.pop((r, v), []) + [columns + j]
                    mask[r, 0, j, own] = 0.0
                    for child in trie.children[v]:
                        seen[(r, child)] = own
                for r, f in enumerate(frontier):
                    mask[r, 0, len(f) :, :prompt_columns] = blocked
                    padding = torch.arange(len(f), width)
                    mask[r, 0, padding, columns + padding] = 0.0
                positions = (batch.next_pos[:, None] + (depth - 1)).expand(b, width)
                with torch.inference_mode():
                    result, cache = forward_with_cache(
                        decoder, cache, input_ids=ids.to(device), attention_mask=mask.to(device),
                        position_ids=positions.to(device),
                    )
                columns += width
                hidden = result.last_hidden_state[torch.as_tensor(rows), torch.as_tensor(slots)]  # (fed, H)
                kids = [trie.children[v] for v in nodes]
                child_tokens = np.zeros((len(nodes), max(1, max(len(k) for k in kids))), dtype=np.int64)
                for i, k in enumerate(kids):
                    child_tokens[i, : len(k)] = [trie.token[c] for c in k]
                cond = np.zeros(child_tokens.shape)
                stop = np.zeros(len(nodes))
                for a in range(0, len(nodes), _LSE_ROWS):  # the output layer on real rows only, in chunks
                    with torch.inference_mode():
                        logits = head(hidden[a : a + _LSE_ROWS])
                    cond[a : a + _LSE_ROWS], stop[a : a + _LSE_ROWS] = self._conditionals(
                        logits, child_tokens[a : a + _LSE_ROWS]
                    )
                frontier = [[] for _ in range(b)]
                for i, (r, v) in enumerate(zip(rows, nodes)):
                    p = prefix[r, v]
                    if trie.answer[v] >= 0:
                        out[r, trie.answer[v]] = p * stop[i]
                    for c, child in enumerate(kids[i]):
                        prefix[r, child] = p * cond[i, c]
                        if prefix[r, child] >= floor:
                            frontier[r].append(child)
        finally:
            if columns > prompt_columns:  # drop the trie columns: the cache holds just the prompts again
                cache.crop(prompt_columns - columns)  # a negative argument removes that many trailing columns
            batch.cache = cache
        return out
