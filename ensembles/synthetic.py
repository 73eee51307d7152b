"""Synthetic teacher families used by the paper's analysis and by our tests and benchmarks.

* :func:`alpha_mixture`: Section 6, ``p^(i) = alpha s + (1 - alpha) r^(i)`` with a shared part ``s`` and a
  teacher-specific part ``r^(i)`` on the teacher's own private tokens.  For a coordinated ensemble the
  count of the shared winner is exactly ``Bin(n, exp(-y (1 - alpha)))`` with ``y ~ Exp(alpha)``, i.e.
  beta-binomial ``BetaBin(n, alpha / (1 - alpha), 1)`` (docs/ensembles.md derives it).
* :func:`disjoint_groups`: teachers in disjoint groups of ``group_size``; a group shares one token with
  probability ``q`` (the tightness example for the transfer lemma: support ``tau = group_size``).
* :func:`planet_z_like`: Section 5.2's curated task without a model: ``k`` common "numbers" ``C``, one
  private number per teacher, a shared bias over numbers, per-teacher noise, and generalisation mass
  on numbers outside the prompt.
* :func:`pooled_supports`: each teacher's support is ``support_size`` tokens drawn from a common pool,
  what top-p truncation of one model on similar prompts gives (used by the speed benchmark).
"""

from __future__ import annotations

import numpy as np

from ensembles.distributions import TeacherDistributions
from pate_accountant.validation import check_generator, check_int, check_real


def _check_room(vocab_size: int, needed: int, what: str) -> None:
    if needed > vocab_size:
        raise ValueError(f"vocab_size={vocab_size} is too small: {what} need {needed} distinct tokens")


def alpha_mixture(
    num_teachers: int,
    vocab_size: int,
    alpha: float,
    rng: np.random.Generator,
    *,
    common_size: int = 1,
    private_size: int = 1,
    common_concentration: float | None = None,
) -> TeacherDistributions:
    """``p^(i) = alpha s + (1 - alpha) r^(i)`` (paper Section 6).

    ``s`` is spread over tokens ``0 .. common_size - 1`` (uniform, or Dirichlet with
    ``common_concentration``); ``r^(i)`` is uniform over ``private_size`` tokens owned by teacher ``i``
    alone (disjoint across teachers and from ``s``).  ``alpha = 1`` gives identical teachers.
    """
    n = check_int("num_teachers", num_teachers, minimum=1)
    vocab_size = check_int("vocab_size", vocab_size, minimum=1)
    alpha = check_real("alpha", alpha, minimum=0.0, maximum=1.0, min_open=True)
    check_generator("rng", rng)
    common_size = check_int("common_size", common_size, minimum=1)
    private_size = check_int("private_size", private_size, minimum=1)
    if alpha == 1.0:
        private_size = 0
    _check_room(vocab_size, common_size + n * private_size, "common_size + num_teachers * private_size")
    if common_concentration is None:
        shared = np.full(common_size, 1.0 / common_size)
    else:
        common_concentration = check_real("common_concentration", common_concentration, minimum=0.0, min_open=True)
        shared = rng.dirichlet(np.full(common_size, common_concentration))
    ids = np.empty((n, common_size + private_size), dtype=np.int64)
    probs = np.empty_like(ids, dtype=np.float64)
    ids[:, :common_size] = np.arange(common_size)
    probs[:, :common_size] = alpha * shared
    if private_size:
        ids[:, common_size:] = common_size + np.arange(n * private_size).reshape(n, private_size)
        probs[:, common_size:] = (1.0 - alpha) / private_size
    return TeacherDistributions.from_sparse(ids, probs, vocab_size)


def disjoint_groups(
    num_teachers: int,
    group_size: int,
    vocab_size: int,
    q: float,
    *,
    private_size: int = 1,
) -> TeacherDistributions:
    """Teachers ``g*group_size .. (g+1)*group_size - 1`` give their group token ``g`` probability ``q``.

    The remaining ``1 - q`` is uniform over ``private_size`` tokens of each teacher's own.  A trailing
    partial group is allowed.  Token ``g`` has support ``c_{g,q} = group_size``.
    """
    n = check_int("num_teachers", num_teachers, minimum=1)
    group_size = check_int("group_size", group_size, minimum=1, maximum=n)
    vocab_size = check_int("vocab_size", vocab_size, minimum=1)
    q = check_real("q", q, minimum=0.0, maximum=1.0, min_open=True)
    private_size = check_int("private_size", private_size, minimum=1)
    groups = -(-n // group_size)
    private = 0 if q == 1.0 else private_size
    _check_room(vocab_size, groups + n * private, "the group tokens plus num_teachers * private_size")
    ids = np.empty((n, 1 + private), dtype=np.int64)
    probs = np.empty(ids.shape)
    ids[:, 0] = np.arange(n) // group_size
    probs[:, 0] = q
    if private:
        ids[:, 1:] = groups + np.arange(n * private).reshape(n, private)
        probs[:, 1:] = (1.0 - q) / private
    return TeacherDistributions.from_sparse(ids, probs, vocab_size)


def planet_z_like(
    num_teachers: int,
    rng: np.random.Generator,
    *,
    common_size: int = 20,
    vocab_size: int = 128_000,
    number_offset: int = 1_000,
    num_numbers: int = 900,
    private_mass: float | None = None,
    generalization_mass: float = 0.25,
    generalization_support: int = 64,
    junk_mass: float = 0.003,
    bias_concentration: float = 1.0,
    teacher_noise: float = 0.5,
) -> tuple[TeacherDistributions, np.ndarray]:
    """A model-free stand-in for the Planet Z task (Section 5.2 and Appendix D.1).

    The ``num_numbers`` "3-digit numbers" are tokens ``number_offset .. number_offset + num_numbers - 1``;
    ``C`` is a random set of ``common_size`` of them.  Teacher ``i``'s prompt lists ``C`` plus one private
    number.  Its distribution puts ``1 - generalization_mass - junk_mass`` on the listed numbers, with
    weights ``bias_j * exp(teacher_noise * z_ij)`` (a shared model bias times per-teacher variation; the
    private number gets weight ``private_mass`` times the in-prompt mass when given, else the same
    treatment as the others), ``generalization_mass`` on ``generalization_support`` other numbers drawn by a
    shared bias, and ``junk_mass`` on one non-number token.  Returns the teachers and the token ids of ``C``.
    """
    n = check_int("num_teachers", num_teachers, minimum=1)
    check_generator("rng", rng)
    k = check_int("common_size", common_size, minimum=1)
    num_numbers = check_int("num_numbers", num_numbers, minimum=k + 2)
    vocab_size = check_int("vocab_size", vocab_size, minimum=1)
    number_offset = check_int("number_offset", number_offset, minimum=1)
    _check_room(vocab_size, number_offset + num_numbers, "number_offset + num_numbers")
    generalization_mass = check_real("generalization_mass", generalization_mass, minimum=0.0, maximum=1.0)
    junk_mass = check_real("junk_mass", junk_mass, minimum=0.0, maximum=1.0)
    if generalization_mass + junk_mass >= 1.0:
        raise ValueError(
            f"generalization_mass + junk_mass must be < 1, got {generalization_mass} + {junk_mass}"
        )
    g = check_int("generalization_support", generalization_support, minimum=1, maximum=num_numbers - k - 1)
    if private_mass is not None:
        private_mass = check_real("private_mass", private_mass, minimum=0.0, maximum=1.0, max_open=True)
    teacher_noise = check_real("teacher_noise", teacher_noise, minimum=0.0)
    bias_concentration = check_real("bias_concentration", bias_concentration, minimum=0.0, min_open=True)

    numbers = number_offset + np.arange(num_numbers)
    common = np.sort(rng.choice(numbers, size=k, replace=False))
    others = np.setdiff1d(numbers, common)
    bias = rng.dirichlet(np.full(num_numbers, bias_concentration)) * num_numbers
    bias_of = dict(zip(numbers.tolist(), bias.tolist()))
    common_bias = np.array([bias_of[c] for c in common])
    other_bias = np.array([bias_of[o] for o in others])

    private = rng.choice(others, size=n)
    in_prompt = 1.0 - generalization_mass - junk_mass
    w_common = common_bias[None, :] * np.exp(teacher_noise * rng.standard_normal((n, k)))
    private_bias = np.array([bias_of[p] for p in private.tolist()])
    w_private = private_bias * np.exp(teacher_noise * rng.standard_normal(n))
    if private_mass is None:
        total = w_common.sum(axis=1) + w_private
        p_common = in_prompt * w_common / total[:, None]
        p_private = in_prompt * w_private / total
    else:
        p_common = in_prompt * (1.0 - private_mass) * w_common / w_common.sum(axis=1, keepdims=True)
        p_private = np.full(n, in_prompt * private_mass)

    # Generalisation: g numbers outside C and outside the teacher's private number, drawn by the shared bias.
    keys = rng.standard_exponential((n, others.size)) / other_bias[None, :]
    keys[others[None, :] == private[:, None]] = np.inf
    chosen = np.argpartition(keys, g - 1, axis=1)[:, :g]
    gen_ids = others[chosen]
    w_gen = other_bias[chosen] * np.exp(teacher_noise * rng.standard_normal((n, g)))
    p_gen = generalization_mass * w_gen / w_gen.sum(axis=1, keepdims=True)

    junk_token = 0
    ids = np.concatenate([np.broadcast_to(common, (n, k)), private[:, None], gen_ids, np.full((n, 1), junk_token)], axis=1)
    probs = np.concatenate([p_common, p_private[:, None], p_gen, np.full((n, 1), junk_mass)], axis=1)
    keep = probs > 0
    rows_ids = [row[m] for row, m in zip(ids, keep)]
    rows_probs = [row[m] for row, m in zip(probs, keep)]
    return TeacherDistributions.from_sparse(rows_ids, rows_probs, vocab_size), common


def pooled_supports(
    num_teachers: int,
    vocab_size: int,
    rng: np.random.Generator,
    *,
    pool_size: int = 3_000,
    support_size: int = 300,
    zipf_exponent: float = 1.0,
    teacher_noise: float = 0.5,
) -> TeacherDistributions:
    """Each teacher: ``support_size`` tokens drawn (by a shared Zipf-like popularity) from one pool.

    Probabilities are the shared popularity times per-teacher log-normal noise, normalised.  This is the
    shape top-p 0.999 gives for one model on similar prompts, and the benchmark's workload.
    """
    n = check_int("num_teachers", num_teachers, minimum=1)
    vocab_size = check_int("vocab_size", vocab_size, minimum=1)
    check_generator("rng", rng)
    pool_size = check_int("pool_size", pool_size, minimum=1, maximum=vocab_size)
    support_size = check_int("support_size", support_size, minimum=1, maximum=pool_size)
    zipf_exponent = check_real("zipf_exponent", zipf_exponent, minimum=0.0)
    teacher_noise = check_real("teacher_noise", teacher_noise, minimum=0.0)
    pool = rng.choice(vocab_size, size=pool_size, replace=False)
    popularity = (1.0 + np.arange(pool_size)) ** -zipf_exponent
    ids = np.empty((n, support_size), dtype=np.int64)
    probs = np.empty((n, support_size))
    step = max(1, (1 << 22) // pool_size)
    for i0 in range(0, n, step):
        i1 = min(n, i0 + step)
        keys = rng.standard_exponential((i1 - i0, pool_size)) / popularity
        chosen = np.argpartition(keys, support_size - 1, axis=1)[:, :support_size]
        weights = popularity[chosen] * np.exp(teacher_noise * rng.standard_normal(chosen.shape))
        ids[i0:i1] = pool[chosen]
        probs[i0:i1] = weights / weights.sum(axis=1, keepdims=True)
    return TeacherDistributions.from_sparse(ids, probs, vocab_size)
