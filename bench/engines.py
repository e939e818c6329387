"""Rollout engines: Tandem's HF decode loop vs in-process vLLM vs TRL's generation path (HF ``generate``).

Three ways to sample the same completions from the same model folder:

- ``hf``: ``build_engine("hf", ...)``, Tandem's own decode loop (the fast Llama stepper);
- ``vllm``: ``build_engine("vllm", ...)``, in-process ``vllm.LLM`` with the engine's default options
  (eager, prefix caching, 1 GiB KV cache on CPU unless ``--kv-cache-gb``);
- ``trl``: ``model.generate`` with sampling and no scores, which is what TRL's ``GRPOTrainer`` calls when it
  does not use vLLM (``bench/engine_speed.py``'s ``time_hf``: TRL repeats each prompt ``n`` times, which
  ``num_return_sequences`` does inside ``generate``; temperature 1, no top-k/top-p, as TRL's defaults).

Workload: ``bench/engine_speed.py``'s 8 arithmetic prompts × ``n = 8`` samples = 64 sequences, temperature 1.
**EOS is switched off in the weights** (:func:`never_eos`), because none of the engines has an ignore-EOS
switch and a random model stops at random: every row then decodes exactly ``max_new_tokens`` tokens in every
engine, so the engines do the same work (``--keep-eos`` keeps EOS; tokens/s then counts the real tokens).

Measured per model and completion length: tokens/s = generated tokens / wall time of one ``generate`` call
(median over repeats), and time to first token = the wall time of a call with ``max_new_tokens=1`` on the
same prompts (prefill + one sampled token for 64 rows). Calls are interleaved (hf, vllm, trl, hf, vllm, trl,
...); one warm-up call per engine and model (32 new tokens) is not counted. Tokens per process-CPU-second
are printed beside (steadier than wall time when other jobs share the cores). Models (``--sizes``): tiny character-level
Llamas, ``1m`` (hidden 128, 4 layers, 4 heads: the default tiny model), ``30m`` (512, 8, 8), ``100m``
(768, 12, 12), ``400m`` (1024, 24, 16; for a GPU); all with head size 32 or 64, which vLLM's CPU
attention supports. The default plan fits the 2-core CPU in about 12 minutes: see ``PLAN``.

    OMP_NUM_THREADS=2 .venv/bin/python bench/engines.py [--sizes 1m 30m 100m] [--repeats N] [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tandem.models import init_tiny_model, load_causal_lm, load_tokenizer
from tandem.rollout import EngineSpec, build_engine

ENGINES = ("hf", "vllm", "trl")
SAMPLES = 8
LENGTHS = {"short": 32, "long": 256}
SIZES: dict[str, dict[str, int]] = {
    "1m": {"hidden_size": 128, "num_layers": 4, "num_heads": 4},
    "30m": {"hidden_size": 512, "num_layers": 8, "num_heads": 8},
    "100m": {"hidden_size": 768, "num_layers": 12, "num_heads": 12},
    "400m": {"hidden_size": 1024, "num_layers": 24, "num_heads": 16},
}
MAX_POSITIONS = 320  # longest prompt + 256 new tokens fits
# Default (lengths, repeats) per size: what the 2-core CPU affords in ~12 minutes for all three engines.
PLAN: dict[str, tuple[tuple[str, ...], int]] = {
    "1m": (("short", "long"), 5),
    "30m": (("short", "long"), 3),
    "100m": (("short",), 3),
    "400m": (("short", "long"), 3),
}
QUICK_REPEATS = 2


def _sibling(name: str) -> types.ModuleType:
    """A module beside this file, loaded by path (no ``sys.path`` change in the importing process)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / f"{name}.py")
        assert spec is not None and spec.loader is not None
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


speed = _sibling("engine_speed")  # PROMPTS, time_tandem (any RolloutEngine), time_hf (HF generate)
PROMPTS = speed.PROMPTS


def never_eos(path: Path, eos_id: int) -> None:
    """Rewrite the model at ``path`` so that it never samples ``eos_id``, leaving everything else random.

    Dimension 0 of the residual stream becomes a constant: every token's embedding there is 1 and no layer
    writes it (row 0 of each ``o_proj`` and ``down_proj`` is zeroed). The embeddings are tied, so the output
    logit of a token gains ``g_0 * x̂_0 * E[t, 0]``: the same shift for every token except EOS, whose
    ``E[eos, 0] = -1`` (EOS never appears in a prompt, so its input embedding is unused). With the final
    norm's ``g_0 = 50`` EOS sits ~100 nats below the rest: a plain model of the same shape and cost that
    decodes to ``max_new_tokens`` in every engine, with no engine-side switch.
    """
    model = load_causal_lm(path)
    with torch.no_grad():
        emb = model.get_input_embeddings().weight  # [V, H]
        emb[:, 0] = 1.0
        emb[eos_id, 0] = -1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0, :] = 0.0  # [H, H]: output row 0
            layer.mlp.down_proj.weight[0, :] = 0.0  # [H, I]
        model.model.norm.weight[0] = 50.0
    model.save_pretrained(path)


def make_model(root: Path, size: str, keep_eos: bool) -> tuple[Path, int]:
    """The model folder for ``size`` and its parameter count."""
    path = init_tiny_model(root / size, max_position_embeddings=MAX_POSITIONS, **SIZES[size])
    if not keep_eos:
        never_eos(path, load_tokenizer(path).eos_token_id)
    n_params = sum(p.numel() for p in load_causal_lm(path).parameters())
    return path, n_params


Timer = Callable[[int, int], tuple[float, int]]  # (new tokens, seed) -> (seconds, generated tokens)
Run = tuple[float, int, float]  # wall seconds, generated tokens, process CPU seconds
Timed = Callable[[int, int], Run]


def build_timers(path: Path, device: str, kv_cache_gb: float | None) -> tuple[dict[str, Timed], Any]:
    """One timer per engine over the model at ``path``; the vLLM engine is returned too (to close)."""
    tokenizer = load_tokenizer(path)
    hf_model = load_causal_lm(path, device=device).eval()
    trl_model = load_causal_lm(path, device=device).eval()
    hf = build_engine("hf", EngineSpec(model=hf_model, tokenizer=tokenizer, path=str(path)))
    options = {} if kv_cache_gb is None else {"kv_cache_gb": kv_cache_gb}
    t0 = time.perf_counter()
    vllm = build_engine("vllm", EngineSpec(path=str(path), tokenizer=tokenizer, options=options))
    print(f"  vllm engine start: {time.perf_counter() - t0:.1f} s", flush=True)

    timers: dict[str, Timer] = {
        "hf": lambda new, seed: speed.time_tandem(hf, SAMPLES, new, seed),
        "vllm": lambda new, seed: speed.time_tandem(vllm, SAMPLES, new, seed),
        "trl": lambda new, seed: speed.time_hf(trl_model, tokenizer, SAMPLES, new, seed),
    }
    return {name: _with_cpu_time(timer) for name, timer in timers.items()}, vllm


def _with_cpu_time(timer: Timer) -> Timed:
    """``timer`` that also returns the process CPU seconds of the call (all threads): steadier than wall
    time when other jobs share the cores, though spinning OpenMP threads count too."""

    def timed(new_tokens: int, seed: int) -> Run:
        cpu = time.process_time()
        seconds, tokens = timer(new_tokens, seed)
        return seconds, tokens, time.process_time() - cpu

    return timed


def measure(timers: dict[str, Timed], new_tokens: int, repeats: int) -> dict[str, list[Run]]:
    """``repeats`` interleaved rounds, each engine once per round (hf, vllm, trl, hf, ...), so load from
    other jobs on the machine hits all engines alike."""
    runs: dict[str, list[Run]] = {name: [] for name in timers}
    for r in range(repeats):
        for name, timer in timers.items():
            runs[name].append(timer(new_tokens, r))
    return runs


def summarise(runs: dict[str, list[Run]]) -> dict[str, dict[str, float]]:
    """Per engine, medians over its runs: seconds, tokens, tokens/s (wall) and tokens per CPU second."""
    return {
        name: {
            "s": statistics.median(s for s, _, _ in rs),
            "tokens": statistics.median(t for _, t, _ in rs),
            "tok_s": statistics.median(t / s for s, t, _ in rs),
            "tok_cpu_s": statistics.median(t / c for _, t, c in rs),
        }
        for name, rs in runs.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=["1m", "30m", "100m"])
    parser.add_argument("--repeats", type=int, default=0, help="timed calls per engine and length (0: PLAN)")
    parser.add_argument("--lengths", nargs="+", choices=list(LENGTHS), help="completion lengths (PLAN's)")
    parser.add_argument("--quick", action="store_true", help=f"short completions, {QUICK_REPEATS} repeats")
    parser.add_argument("--threads", type=int, default=2, help="torch threads on CPU")
    parser.add_argument("--keep-eos", action="store_true", help="leave EOS in the model (rows stop early)")
    parser.add_argument("--kv-cache-gb", type=float, help="vLLM KV cache (default: the engine's)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    print(
        f"{len(PROMPTS)} prompts x n={SAMPLES}; temperature 1; EOS {'kept' if args.keep_eos else 'off'}; "
        f"device {args.device}; torch threads {torch.get_num_threads()}; load average {_load()}",
        flush=True,
    )
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            rows += bench_size(Path(tmp), size, args)
    print(f"\ntotal {time.perf_counter() - started:.0f} s; load average {_load()}")
    print_tables(rows)


Row = tuple[str, int, int, int, dict[str, dict[str, float]]]  # size, params, new tokens, repeats, result


def bench_size(root: Path, size: str, args: argparse.Namespace) -> list[Row]:
    """One model: a warm-up call per engine, then time to first token, then each completion length."""
    plan_lengths, plan_repeats = PLAN[size]
    lengths = args.lengths or (("short",) if args.quick else plan_lengths)
    repeats = args.repeats or (QUICK_REPEATS if args.quick else plan_repeats)
    path, n_params = make_model(root, size, args.keep_eos)
    print(f"{size}: {n_params / 1e6:.2f}M params; {list(lengths)}; {repeats} repeats", flush=True)
    timers, vllm = build_timers(path, args.device, args.kv_cache_gb)
    rows: list[Row] = []
    try:
        for timer in timers.values():  # first-call costs (allocation, vLLM's first schedule): not counted
            timer(LENGTHS["short"], 12345)
        for new_tokens in (1, *(LENGTHS[name] for name in lengths)):
            t0 = time.perf_counter()
            result = summarise(measure(timers, new_tokens, repeats))
            rows.append((size, n_params, new_tokens, repeats, result))
            print(
                f"  {new_tokens} new tokens: "
                + ", ".join(f"{k} {v['tok_s']:.0f} tok/s ({v['s']:.2f} s/call)" for k, v in result.items())
                + f" ({time.perf_counter() - t0:.0f} s, load {_load()})",
                flush=True,
            )
    finally:
        vllm.close()
    return rows


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def print_tables(rows: list[Row]) -> None:
    """Markdown tables: throughput per (model, length), then time to first token per model."""
    print("\n| model | params | new tokens | repeats | hf tok/s | vllm tok/s | trl tok/s | vllm/hf | trl/hf "
          "| vllm/hf per CPU-s | trl/hf per CPU-s |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size, n_params, new_tokens, repeats, r in rows:
        if new_tokens == 1:
            continue
        short = {e: r[e]["tokens"] for e in ENGINES}
        if len(set(short.values())) > 1:  # only with --keep-eos
            print(
                f"<!-- {size} {new_tokens}: tokens per call "
                + ", ".join(f"{k} {v:.0f}" for k, v in short.items())
                + " -->"
            )
        cells = [size, f"{n_params / 1e6:.1f}M", str(new_tokens), str(repeats)]
        cells += [f"{r[e]['tok_s']:.0f}" for e in ENGINES]
        cells += [f"{r[e]['tok_s'] / r['hf']['tok_s']:.2f}" for e in ENGINES[1:]]
        cells += [f"{r[e]['tok_cpu_s'] / r['hf']['tok_cpu_s']:.2f}" for e in ENGINES[1:]]
        print("| " + " | ".join(cells) + " |")
    print("\n| model | TTFT hf ms | TTFT vllm ms | TTFT trl ms | vllm/hf | trl/hf |")
    print("|---|---:|---:|---:|---:|---:|")
    for size, _, new_tokens, _, r in rows:
        if new_tokens != 1:
            continue
        ms = {e: 1000 * r[e]["s"] for e in ENGINES}
        print(
            f"| {size} | {ms['hf']:.0f} | {ms['vllm']:.0f} | {ms['trl']:.0f} "
            f"| {ms['vllm'] / ms['hf']:.2f} | {ms['trl'] / ms['hf']:.2f} |"
        )


if __name__ == "__main__":
    main()
