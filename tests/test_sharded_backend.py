"""ShardedBackend (ensembles/backends/sharded.py, docs/distributed.md): teachers split over in-process workers
or Ray actors vote, generate and charge exactly as one unsharded backend, also when a worker is lost and
rebuilt mid-run.

Workers build their backends from picklable factories of this module: a context-driven ToyBackend, and the
tiny random Llama of ``test_transformers_backend`` (fixed seed, so every shard gets identical weights).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from ensembles.backends import ToyBackend
from ensembles.backends.base import NextTokenBackend
from ensembles.backends.sharded import (
    BackendSpec,
    InProcessExecutor,
    ShardedBackend,
    ShardLostError,
    concat_distributions,
    shard_bounds,
)
from ensembles.generation import PrivateGenerator
from ensembles.keyed_votes import StepKey
from mechanisms import BetweenThresholds, DPArgMax
from pate_accountant.accountants import BasicCompositionAccountant
from pate_accountant.accountants.individual import IndividualChargingAccountant

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB = [f"w{i}" for i in range(15)] + ["<eos>"]
EOS = len(VOCAB) - 1
SECRET = "zanzibarquokka"
OPTIONS = [("coordinated", None), ("coordinated", 0.8), ("independent", None), ("independent", 0.8)]


# -- picklable factories (the workers build their backends from these) ---------------------------------------
def dirichlet_model(teacher, context):
    """A context's own random distribution (the teacher index is not used: shards see local indices)."""
    rng = np.random.default_rng([len(context), *context])
    return rng.dirichlet(np.full(len(VOCAB), 0.3))


def chain_model(teacher, context):
    """Mostly the successor of the last word, plus a word named by the prompt's first word (teachers differ)."""
    p = np.full(len(VOCAB), 0.01)
    last = context[-1] if context else 0
    p[(last + 1) % EOS] += 0.8
    if context:
        p[(context[0] * 5 + 3) % EOS] += 0.15
    return p / p.sum()


def toy_backend(model=dirichlet_model):
    return ToyBackend(model, VOCAB)


def tiny_llama_backend(batch_size: int = 2):
    """The tiny random Llama of test_transformers_backend, built from its fixed seed (identical on every shard)."""
    from test_transformers_backend import _tokenizer, tiny_llama

    from ensembles.backends.transformers_backend import TransformersBackend

    tokenizer = _tokenizer()
    return TransformersBackend(tiny_llama(tokenizer), tokenizer, threads=1, batch_size=batch_size)


def toy_prompts(n: int) -> list[str]:
    return [" ".join(VOCAB[(i * j + i) % EOS] for j in range(1, 3 + i % 3)) for i in range(n)]


def llama_prompts(n: int) -> list[str]:
    from test_transformers_backend import PROMPTS

    # most teachers share a prompt, so coordinated votes agree and DPArgMax releases
    return [PROMPTS[0] if i % 4 else PROMPTS[1 + i % 3] for i in range(n)]


@pytest.fixture(scope="module")
def llama():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from test_transformers_backend import PREFIX

    return PREFIX


def _sharded(factory, shards, *args, parallel=False, **kwargs):
    return ShardedBackend(BackendSpec(factory, *args), shards, executor=InProcessExecutor(parallel=parallel), **kwargs)


def _same_votes(sharded, plain, keys):
    for key in keys:
        for histograms, top_p in OPTIONS:
            got = sharded.votes(key, temperature=0.7, top_p=top_p, histograms=histograms)
            want = plain.votes(key, temperature=0.7, top_p=top_p, histograms=histograms)
            assert got.dtype == np.int32
            np.testing.assert_array_equal(got, want)


def _walk(sharded, plain, keys_per_step: int):
    """A series of steps with appends and drops; votes and teachers compared after each."""
    for step, (token, drop) in enumerate([(None, None), (3, None), (7, [1, 6]), (2, [0]), (11, None)]):
        if token is not None:
            sharded.append(token)
            plain.append(token)
        if drop is not None:
            sharded.drop_teachers(drop)
            plain.drop_teachers(drop)
        np.testing.assert_array_equal(sharded.active_teachers(), plain.active_teachers())
        _same_votes(sharded, plain, [StepKey(2026, step, r) for r in range(keys_per_step)])


# -- pieces ----------------------------------------------------------------------------------------------------
def test_shard_bounds_are_contiguous_and_near_equal():
    assert shard_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert shard_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert shard_bounds(7, 1) == [(0, 7)]
    with pytest.raises(ValueError, match="num_shards"):
        shard_bounds(3, 0)


def test_concat_distributions_stacks_rows():
    backend = toy_backend()
    backend.begin(toy_prompts(5))
    whole = backend.distributions()
    parts = [whole.subset(np.array([0, 1])), whole.subset(np.array([2])), whole.subset(np.array([3, 4]))]
    joined = concat_distributions(parts)
    np.testing.assert_array_equal(joined.to_dense(), whole.to_dense())
    np.testing.assert_array_equal(joined.tail, whole.tail)
    with pytest.raises(ValueError):
        concat_distributions([])


# -- exactness -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("shards", [1, 2, 4])
def test_toy_shards_vote_like_one_backend(shards, parallel):
    plain = toy_backend()
    with _sharded(toy_backend, shards, parallel=parallel) as sharded:
        assert isinstance(sharded, NextTokenBackend)
        assert sharded.vocab_size == len(VOCAB) and sharded.eos_token_id == EOS
        for backend in (plain, sharded):
            backend.begin(toy_prompts(11), shared_prefix="w1 w2")
        _walk(sharded, plain, keys_per_step=4)
        np.testing.assert_array_equal(sharded.distributions().to_dense(), plain.distributions().to_dense())
        contexts = [[1, 2], [3], [4, 5, 6], [7], [8, 9]]
        np.testing.assert_array_equal(sharded.next_token_distributions(contexts).to_dense(),
                                      plain.next_token_distributions(contexts).to_dense())
        assert sharded.decode(sharded.encode("w3 w4")) == "w3 w4"


@pytest.mark.parametrize("shards", [1, 2, 4])
def test_tiny_llama_shards_vote_like_one_backend(llama, shards):
    """Device votes (TransformersBackend.votes) on every shard equal the unsharded backend's, dense and top-p,
    Hot and Cold, through appends and drops."""
    plain = tiny_llama_backend(batch_size=3)
    with _sharded(tiny_llama_backend, shards) as sharded:
        for backend in (plain, sharded):
            backend.begin(llama_prompts(10), shared_prefix=llama)
        _walk(sharded, plain, keys_per_step=3)
        np.testing.assert_allclose(sharded.distributions().to_dense(), plain.distributions().to_dense(), atol=1e-6)


def _llama_run(backend, prefix, *, on_token=None):
    generator = PrivateGenerator(backend, DPArgMax(8.0, 1e-3), BasicCompositionAccountant(budget=(200.0, 0.5)),
                                 max_tokens=8, fallback="retry", max_retries=2, top_p=0.9, temperature=0.8)
    return generator.generate(llama_prompts(12), shared_prefix=prefix, seed=11,
                              mechanism_rng=np.random.default_rng(7), on_token=on_token)


@pytest.fixture(scope="module")
def llama_reference(llama):
    result = _llama_run(tiny_llama_backend(), llama)
    assert result.outcome_counts().get("token", 0) >= 3  # the run releases tokens privately
    return result


@pytest.mark.parametrize("shards", [1, 2, 4])
def test_private_run_on_shards_equals_the_unsharded_run(llama, llama_reference, shards):
    with _sharded(tiny_llama_backend, shards) as sharded:
        result = _llama_run(sharded, llama)
    assert result == llama_reference


# -- fault tolerance -------------------------------------------------------------------------------------------
def test_a_lost_shard_is_rebuilt_and_the_run_is_unchanged(llama, llama_reference, caplog):
    with _sharded(tiny_llama_backend, 3) as sharded:
        lost = []

        def kill(token):  # after the 2nd and 4th released token, lose a worker; the next call rebuilds it
            lost.append(token)
            if len(lost) in (2, 4):
                sharded.executor.kill_worker(len(lost) // 2)

        result = _llama_run(sharded, llama, on_token=kill)
        assert sharded.rebuilds == [0, 1, 1]
    assert result == llama_reference
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "shard 1: worker lost; rebuilding it" in messages and "shard 2" in messages


def test_rebuilds_are_capped_with_a_clear_error():
    with _sharded(toy_backend, 2, max_rebuilds=1) as sharded:
        sharded.begin(toy_prompts(4))
        sharded.executor.kill_worker(1)
        sharded.votes(StepKey(1))  # rebuilt once
        sharded.executor.kill_worker(1)
        with pytest.raises(ShardLostError, match=r"shard 1: .* lost 2 times in this run, more than max_rebuilds=1"):
            sharded.votes(StepKey(1))


def test_lost_worker_during_begin_and_drop_is_rebuilt():
    plain = toy_backend()
    plain.begin(toy_prompts(9))
    with _sharded(toy_backend, 3) as sharded:
        sharded.executor.kill_worker(0)
        sharded.begin(toy_prompts(9))
        sharded.append(4)
        plain.append(4)
        sharded.executor.kill_worker(2)
        sharded.drop_teachers([7, 1])
        plain.drop_teachers([7, 1])
        _same_votes(sharded, plain, [StepKey(3, 1, r) for r in range(3)])
        assert list(sharded.executor.workers[2].active_teachers()) == [0, 2]


# -- individual charging ---------------------------------------------------------------------------------------
def _individual_run(backend, n):
    bt = BetweenThresholds(0.5, 3, 30)  # counts of 3 to n < 30 are hits: the counted teachers are charged
    accountant = IndividualChargingAccountant(n, per_teacher_limit=3, epsilon0=0.5, q=bt.q)
    generator = PrivateGenerator(backend, bt, accountant, max_tokens=12, fallback="public", max_retries=0,
                                 public_backend=ToyBackend(chain_model, VOCAB), seed=5)
    result = generator.generate(toy_prompts(n), mechanism_rng=np.random.default_rng(3))
    return result, accountant


def test_individual_charging_drops_teachers_on_their_shard():
    plain_result, plain_accountant = _individual_run(toy_backend(chain_model), 20)
    with _sharded(toy_backend, 3, chain_model) as sharded:
        result, accountant = _individual_run(sharded, 20)
        active = sharded.active_teachers()
        assert 0 < active.size < 20 and not ((active >= 7) & (active < 14)).any()  # shard 1 has none left
        np.testing.assert_array_equal(active, accountant.active_teachers())
        for k, (lo, hi) in enumerate(shard_bounds(20, 3)):
            local = sharded.executor.workers[k].active_teachers()
            np.testing.assert_array_equal(lo + local, active[(active >= lo) & (active < hi)])
    assert result == plain_result
    assert accountant.removed_teachers == plain_accountant.removed_teachers


# -- errors and privacy ----------------------------------------------------------------------------------------
def test_errors_name_the_shard_and_never_the_prompt(llama):
    with _sharded(tiny_llama_backend, 2) as sharded:
        prompts = llama_prompts(4)
        prompts[3] = f"{SECRET} " * 80
        with pytest.raises(ValueError, match=r"shard 1 \(teachers 2 to 3\): check_prompts failed: teacher prompt 1 "
                                             r"is \d+ tokens") as info:
            sharded.check_prompts(prompts, llama)
        assert SECRET not in str(info.value)
        with pytest.raises(ValueError, match="shard 1") as info:
            sharded.begin(prompts, llama)
        assert SECRET not in str(info.value)
        with pytest.raises(RuntimeError, match="begin"):
            sharded.votes(StepKey(1))  # a failed begin leaves no run
        sharded.begin(llama_prompts(4))
        with pytest.raises(TypeError, match="StepKey"):
            sharded.votes((1, 0, 0))
        with pytest.raises(ValueError, match="teacher_ids"):
            sharded.votes(StepKey(1), teacher_ids=[0, 1])
        with pytest.raises(ValueError, match="outside"):
            sharded.append(10**6)
        with pytest.raises(ValueError, match=r"\[0, 4\)"):
            sharded.drop_teachers([4])


def test_constructor_checks():
    with pytest.raises(TypeError, match="build"):
        ShardedBackend(toy_backend, 2)
    with pytest.raises(ValueError, match="num_shards"):
        ShardedBackend(BackendSpec(toy_backend), 0)
    with pytest.raises(TypeError, match="NextTokenBackend"):
        ShardedBackend(BackendSpec(dict), 1)
    with pytest.raises(TypeError, match="callable"):
        BackendSpec("toy_backend")
    assert "zanzibar" not in repr(BackendSpec(toy_backend, SECRET))


def test_transformers_spec_loads_in_each_worker_and_decodes_locally(llama, tmp_path):
    from ensembles.backends.sharded import TransformersSpec

    backend = tiny_llama_backend()
    backend.model.save_pretrained(tmp_path)
    backend.tokenizer.save_pretrained(tmp_path)
    spec = TransformersSpec.for_model(tmp_path, threads=1, batch_size=2)
    with ShardedBackend(spec, 2) as sharded:
        assert sharded._codec is not None  # encode/decode without a model or a worker call
        assert sharded.vocab_size == backend.vocab_size and sharded.eos_token_id == backend.eos_token_id
        ids = sharded.encode("the lazy dog")
        assert ids == backend.encode("the lazy dog") == sharded._call(0, "encode", "the lazy dog")
        assert sharded.decode(ids) == backend.decode(ids)
        sharded.begin(llama_prompts(5), llama)
        backend.begin(llama_prompts(5), llama)
        _same_votes(sharded, backend, [StepKey(4, 0, r) for r in range(3)])
    with pytest.raises(ValueError, match="does not exist"):
        TransformersSpec.for_model(tmp_path / "missing")


# -- Ray -------------------------------------------------------------------------------------------------------
@pytest.fixture
def local_ray():
    """A local two-CPU Ray cluster whose workers can import this module; shut down afterwards."""
    import ray  # the `distributed` extra: a missing ray fails this test, it is not skipped

    tests = str(Path(__file__).parent)
    path = os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH")) if p)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             runtime_env={"env_vars": {"PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}})
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_ray_actors_equal_the_in_process_run_and_survive_a_killed_actor(llama, llama_reference, local_ray):
    from ensembles.backends.sharded import RayExecutor

    ray = local_ray
    spec = BackendSpec(tiny_llama_backend)
    with ShardedBackend(spec, 2, executor=RayExecutor()) as sharded:
        assert _llama_run(sharded, llama) == llama_reference
        actors = sharded.executor.actors
        released = []

        def kill(token):
            released.append(token)
            if len(released) == 3:
                ray.kill(sharded.executor.actors[1])

        assert _llama_run(sharded, llama, on_token=kill) == llama_reference
        assert sharded.rebuilds == [0, 1]
        assert sharded.executor.actors[0] == actors[0] and sharded.executor.actors[1] != actors[1]
    assert ray.is_initialized()  # the executor did not start Ray, so it leaves it to its owner
