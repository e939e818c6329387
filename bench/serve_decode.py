"""Where a served request's time goes, model side: CPU per 32-row batch of `tandem serve`'s decoder.

Runs :func:`tandem.serve.decode.decode_rows` (what the in-process server runs per batch) on each model
folder (HF folder or INT8 export, loaded by :func:`tandem.models.load_model` as the server loads it) for
32 sampled arithmetic prompts, ``max_tokens`` 16, without seeds as bench/serve.py's requests (seeded rows
are sampled one by one, unseeded ones as a batch), interleaved over ``--rounds``, and reports the median
thread CPU time per batch (CPU time, not wall: the machine is shared) with the fast Llama stepper and
with the generic HF stepper, plus the CPU of one dynamic INT8 Linear against fp32 at the models' widths.
Compare with bench/serve.py's server CPU per request to see the fixed per-request share (HTTP, JSON,
tokenisation, batching).

    OMP_NUM_THREADS=1 .venv/bin/python bench/serve_decode.py --models teacher=DIR,int8=DIR
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def batch_cpu_ms(model, tokenizer, rows, fast: bool | None, rounds: int) -> tuple[float, float]:
    """Median thread CPU ms of one ``decode_rows`` call, and the mean tokens generated per row."""
    from tandem.serve.decode import decode_rows

    decode_rows(model, tokenizer, rows, fast_decode=fast)  # warm-up
    times, tokens = [], []
    for _ in range(rounds):
        started = time.thread_time()
        out = decode_rows(model, tokenizer, rows, fast_decode=fast)
        times.append(1000 * (time.thread_time() - started))
        tokens.append(statistics.mean(len(r.token_ids) for r in out))
    return statistics.median(times), statistics.mean(tokens)


def linear_us(width: int, batch: int = 32, calls: int = 2000) -> tuple[float, float]:
    """Thread CPU microseconds of one ``[batch, 1, width] -> 4 width`` fp32 and dynamic INT8 Linear."""
    from tandem.models.int8 import quantize_int8

    fp32 = torch.nn.Linear(width, 4 * width, bias=False).eval()
    holder = torch.nn.Module()
    holder.lin, holder.config = fp32, type("C", (), {"tie_word_embeddings": False})()
    int8 = quantize_int8(holder).lin
    x = torch.randn(batch, 1, width)
    out = []
    for layer in (fp32, int8):
        for _ in range(100):
            layer(x)
        started = time.thread_time()
        for _ in range(calls):
            layer(x)
        out.append(1e6 * (time.thread_time() - started) / calls)
    return out[0], out[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", required=True, help="NAME=FOLDER,...")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from tandem.models import load_model, load_tokenizer
    from tandem.models.int8 import quantized_linears
    from tandem.rollout.base import SamplingParams
    from tandem.rollout.llama_decode import supports_fast_decode
    from tandem.serve.decode import RowRequest

    models = dict(item.split("=", 1) for item in args.models.split(","))
    loaded = {name: (load_model(folder), load_tokenizer(folder)) for name, folder in models.items()}
    print(
        "| model | params | fast stepper | CPU ms / batch of 32, fast | CPU ms, HF stepper | tokens / row |"
    )
    print("|---|---|---|---|---|---|")
    for name, (model, tok) in loaded.items():
        params = sum(p.numel() for p in model.parameters())
        params += sum(m.weight().numel() for m in quantized_linears(model).values())
        rows = [
            RowRequest(
                list(tok(f"{i}+{(7 * i) % 50}=")["input_ids"]),
                SamplingParams(max_new_tokens=args.max_tokens, temperature=0.8),
            )
            for i in range(32)
        ]
        fast, tokens = batch_cpu_ms(model, tok, rows, None, args.rounds)
        slow, _ = batch_cpu_ms(model, tok, rows, False, args.rounds)
        print(
            f"| {name} | {params / 1e6:.2f}M | {supports_fast_decode(model, 64)} | {fast:.1f} | {slow:.1f} "
            f"| {tokens:.1f} |"
        )
    for width in sorted({int(m.config.hidden_size) for m, _ in loaded.values()}):
        fp32, int8 = linear_us(width)
        print(f"Linear {width} -> {4 * width}, 32 rows: fp32 {fp32:.0f} us, dynamic INT8 {int8:.0f} us CPU")
    print(f"load average (1, 5, 15 min): {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
