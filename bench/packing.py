"""Update throughput on a length-skewed batch: padded micro-batches vs token-budget packing, and what
gradient checkpointing and bf16 autocast cost and save (issue 15, items 5 and 6).

One policy update (GRPO loss, AdamW) of a ~4.7M-parameter Llama (vocab 2048, hidden 256, 4 layers) on
64 rows with distinct prompts of 8..32 tokens and completions of 4..256 tokens, drawn either
log-uniformly (``skewed``: most short, a few long, as RL completions are) or uniformly; ``grouped`` is
the skewed batch as 8 GRPO groups of 8 completions sharing a prompt. Arms:

- ``padded``: ``trainer.micro_batch_size=8`` (each micro-batch padded to its longest row);
- ``packed``: ``trainer.micro_batch_tokens = 8 * (32 + 256)``, the padded micro-batch's token capacity,
  so both arms have the same worst-case activation memory;
- ``padded +prefix`` (grouped): padded micro-batches of one group each, with shared-prefix scoring
  (``trainer.shared_prefix``: the group's prompt runs once); packing turns shared-prefix scoring off;
- ``+gc``: ``trainer.gradient_checkpointing=true``; ``+bf16``: ``model.autocast_bf16`` (bf16 autocast).

Every (arm, repeat) runs in its own process, interleaved by repeat, so peak RSS is per arm: ``peak MB``
is the peak resident memory above the process's memory after loading the model and batch (it includes
AdamW's state, 2 x params x 4 B = 38 MB, the same in every arm). Each process runs one warm-up update,
then ``--updates`` timed ones; tokens/s counts real tokens (prompt + completion) per second of the
process's CPU time (one torch thread), which a machine shared with other jobs disturbs far less than
wall time (also printed).

    OMP_NUM_THREADS=1 .venv/bin/python bench/packing.py [--repeats 3] [--updates 1]
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import subprocess
import sys
import time

import torch

ARMS = {  # name -> (distribution, trainer overrides, autocast_bf16)
    "skewed padded": ("skewed", {"micro_batch_size": 8}, False),
    "skewed packed": ("skewed", {"micro_batch_tokens": 8 * (32 + 256)}, False),
    "skewed padded +gc": ("skewed", {"micro_batch_size": 8, "gradient_checkpointing": True}, False),
    "skewed packed +gc": (
        "skewed",
        {"micro_batch_tokens": 8 * (32 + 256), "gradient_checkpointing": True},
        False,
    ),
    "skewed packed +bf16": ("skewed", {"micro_batch_tokens": 8 * (32 + 256)}, True),
    "uniform padded": ("uniform", {"micro_batch_size": 8}, False),
    "uniform packed": ("uniform", {"micro_batch_tokens": 8 * (32 + 256)}, False),
    "grouped padded +prefix": ("grouped", {"micro_batch_size": 8}, False),
    "grouped packed": ("grouped", {"micro_batch_tokens": 8 * (32 + 256)}, False),
}
B, P, R = 64, 32, 256


def _batch(dist: str, seed: int = 0):
    from tandem.types import Experience, RolloutBatch

    g = torch.Generator().manual_seed(seed)
    p_len = torch.randint(8, P + 1, (B,), generator=g)
    u = torch.rand(B, generator=g)
    if dist in ("skewed", "grouped"):
        r_len = torch.exp(math.log(4) + u * (math.log(R) - math.log(4))).round().long()
    else:
        r_len = (4 + u * (R - 4)).round().long()
    prompt_ids = torch.randint(3, 2048, (B, P), generator=g)
    if dist == "grouped":  # GRPO-style: 8 groups of 8 completions of one prompt
        p_len, prompt_ids = p_len[::8].repeat_interleave(8), prompt_ids[::8].repeat_interleave(8, dim=0)
    prompt_mask = torch.arange(P)[None, :] >= (P - p_len)[:, None]
    mask = torch.arange(R)[None, :] < r_len[:, None]
    rollout = RolloutBatch(
        prompt_ids=prompt_ids * prompt_mask,
        prompt_mask=prompt_mask,
        response_ids=torch.randint(3, 2048, (B, R), generator=g) * mask,
        response_mask=mask,
        behavior_logprobs=-torch.rand(B, R, generator=g) * mask,
        group_ids=torch.arange(B) // 8,
        policy_version=torch.zeros(B, dtype=torch.long),
        prompts=["p"] * B,
        completions=["c"] * B,
        finish_reasons=["stop"] * B,
    )
    adv = torch.randn(B, 1, generator=g).expand(B, R) * mask
    exp = Experience(
        rollout=rollout, scores=torch.randn(B, generator=g), old_logprobs=None, advantages=adv, returns=adv
    )
    return exp, int(p_len.sum() + r_len.sum())


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def child(arm: str, updates: int) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    from tandem.config.schema import AlgorithmConfig, TrainerConfig
    from tandem.train.optim import build_optimizer
    from tandem.train.update import UpdateSettings, policy_update

    torch.set_num_threads(1)
    dist, overrides, bf16 = ARMS[arm]
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=2048, hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=512, tie_word_embeddings=True,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config)
    exp, tokens = _batch(dist)
    trainer = TrainerConfig(lr=1e-5, **overrides)
    settings = UpdateSettings.from_config(
        AlgorithmConfig(name="grpo"),
        trainer,
        temperature=1.0,
        autocast_bf16=bf16,
        max_new_tokens=R,
        share_prefix=dist == "grouped",  # shared-prefix scoring (padded arm only)
    )
    opt = build_optimizer(model, trainer)
    base = _rss_mb()
    policy_update(model, opt, None, exp, settings)  # warm-up (allocator, AdamW state)
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(updates):
        policy_update(model, opt, None, exp, settings)
    seconds = (time.process_time() - cpu_start) / updates
    wall = (time.perf_counter() - start) / updates
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base
    params = sum(p.numel() for p in model.parameters())
    return {"arm": arm, "tokens": tokens, "seconds": seconds, "wall": wall, "peak_mb": peak, "params": params}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--updates", type=int, default=1)
    ap.add_argument("--arms", nargs="*", default=list(ARMS))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.updates)))
        return
    runs: dict[str, list[dict]] = {a: [] for a in args.arms}
    for rep in range(args.repeats):  # interleaved: every arm once per repeat
        for arm in args.arms:
            cmd = [sys.executable, __file__, "--child", arm, "--updates", str(args.updates)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            runs[arm].append(json.loads(out.strip().splitlines()[-1]))
            r = runs[arm][-1]
            print(
                f"  repeat {rep}: {arm}: {r['seconds']:.2f} CPU s, {r['wall']:.2f} s",
                file=sys.stderr,
                flush=True,
            )
    first = next(iter(runs.values()))[0]
    print(f"model: {first['params'] / 1e6:.2f}M parameters; {B} rows; one thread; median of {args.repeats}")
    print("| arm | real tokens | CPU s/update | tokens/CPU s | wall s | peak MB above model |")
    print("|---|---:|---:|---:|---:|---:|")
    med = {}
    for arm, rs in runs.items():
        s = statistics.median(r["seconds"] for r in rs)
        mb = statistics.median(r["peak_mb"] for r in rs)
        med[arm] = (s, mb)
        wall = statistics.median(r["wall"] for r in rs)
        print(f"| {arm} | {rs[0]['tokens']} | {s:.2f} | {rs[0]['tokens'] / s:.0f} | {wall:.2f} | {mb:.0f} |")
    for dist, padded in (("skewed", "padded"), ("uniform", "padded"), ("grouped", "padded +prefix")):
        pad, pack = med.get(f"{dist} {padded}"), med.get(f"{dist} packed")
        if pad and pack:
            print(f"{dist}: packed / padded tokens/s = {pad[0] / pack[0]:.2f}x")
    for arm in ("skewed padded", "skewed packed"):
        if arm in med and f"{arm} +gc" in med:
            (s0, m0), (s1, m1) = med[arm], med[f"{arm} +gc"]
            print(f"{arm} +gc: time x{s1 / s0:.2f}, peak memory x{m1 / m0:.2f}")
    if "skewed packed" in med and "skewed packed +bf16" in med:
        (s0, m0), (s1, m1) = med["skewed packed"], med["skewed packed +bf16"]
        print(f"skewed packed +bf16: time x{s1 / s0:.2f}, peak memory x{m1 / m0:.2f}")


if __name__ == "__main__":
    main()
