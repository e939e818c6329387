"""Micro-benchmark: Tandem's HFEngine decode loop vs Hugging Face ``model.generate``.

``tandem`` uses the fast Llama stepper, ``tandem_generic`` the same loop over the plain HF forward.
Same tiny Llama (hidden 128, 4 layers, ~1.06M params, character tokenizer), same 8 prompts × 8 samples
= 64 sequences, 32 new tokens, plain sampling (temperature 1, no top-k/top-p). Runs alternate between
the two so machine noise hits both; the median of each is reported.

    .venv/bin/python bench/engine_speed.py [--rounds 7] [--new-tokens 32]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from tandem.models import init_tiny_model, load_causal_lm, load_tokenizer
from tandem.rollout import HFEngine, SamplingParams

PROMPTS = [f"{a}+{b}=" for a, b in [(12, 7), (3, 45), (101, 9), (8, 8), (77, 23), (5, 600), (41, 2), (9, 99)]]


def time_tandem(engine: HFEngine, n: int, new_tokens: int, seed: int) -> tuple[float, int]:
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, n=n, seed=seed)
    start = time.perf_counter()
    batch = engine.generate(PROMPTS, params)
    return time.perf_counter() - start, int(batch.response_mask.sum())


def time_hf(model, tokenizer, n: int, new_tokens: int, seed: int) -> tuple[float, int]:
    """HF ``generate`` as TRL calls it; inputs go to the model's device, and CUDA is synchronised around it."""
    cuda = model.device.type == "cuda"
    torch.manual_seed(seed)
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True).to(model.device)
    with torch.inference_mode():
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new_tokens,
            num_return_sequences=n,
            pad_token_id=tokenizer.pad_token_id,
        )
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    response = out[:, enc.input_ids.shape[1] :]  # [B, R]
    # Count tokens up to and including the first EOS (HF pads after it).
    is_eos = response == tokenizer.eos_token_id
    after_eos = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0
    return elapsed, int((~after_eos).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt (8 prompts)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = init_tiny_model(f"{tmp}/tiny", hidden_size=128, num_layers=4, num_heads=4)
        model, tokenizer = load_causal_lm(path), load_tokenizer(path)
    model.eval()
    engines = {
        "tandem": HFEngine(model, tokenizer),
        "tandem_generic": HFEngine(model, tokenizer, fast_decode=False),
    }
    results: dict[str, list[tuple[float, int]]] = {"hf_generate": [], "tandem_generic": [], "tandem": []}
    time_hf(model, tokenizer, args.samples, args.new_tokens, seed=0)  # warm-up
    for engine in engines.values():
        time_tandem(engine, args.samples, args.new_tokens, seed=12345)
    for r in range(args.rounds):
        results["hf_generate"].append(time_hf(model, tokenizer, args.samples, args.new_tokens, seed=r))
        for name, engine in engines.items():
            results[name].append(time_tandem(engine, args.samples, args.new_tokens, seed=r))
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"model: tiny Llama {n_params / 1e6:.2f}M params; {len(PROMPTS)} prompts x {args.samples} samples; "
        f"{args.new_tokens} new tokens; {torch.get_num_threads()} threads"
    )
    print(f"{'system':<15} {'median s':>9} {'tokens':>7} {'tokens/s':>9}")
    rates = {}
    for name, runs in results.items():
        seconds = statistics.median(s for s, _ in runs)
        tokens = statistics.median(t for _, t in runs)
        rates[name] = statistics.median(t / s for s, t in runs)
        print(f"{name:<15} {seconds:>9.4f} {tokens:>7.0f} {rates[name]:>9.0f}")
    print(f"ratio (tandem / hf_generate tokens/s): {rates['tandem'] / rates['hf_generate']:.2f}x")


if __name__ == "__main__":
    main()
