"""The event loop's CPU per request of `tandem serve`, without the model: where the fixed cost goes.

Builds the server's ASGI app (:func:`tandem.serve.server.make_app`, the same middleware and endpoints
uvicorn runs) over a model folder and drives ``POST /v1/completions`` through it in-process, 32 requests
at a time, bench/serve.py's bodies (sampled, ``max_tokens`` 16). Each arm's batcher answers every row at
once with a fixed 3-token result, so the figure is the event loop's own work per request: body read,
JSON, validation, tokenisation, planning the rows, the response and metrics. It leaves out uvicorn's
HTTP parsing and socket writes, which bench/serve.py's server CPU includes. Reported: thread CPU
microseconds per request over ``--rounds`` rounds of ``--requests`` (median, min), and with
``--profile`` the functions with the most CPU (cProfile with thread CPU time, which inflates every
figure about 3x).

Run it at two commits to see what a change saved (CPU time is robust to other jobs, not immune):

    OMP_NUM_THREADS=1 .venv/bin/python bench/serve_overhead.py --model runs/quickstart
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time


def build(model: str):
    """The app over ``model`` and a ``start()`` that starts its batchers, answering every row at once."""
    from tandem.serve.batcher import Job
    from tandem.serve.decode import RowResult
    from tandem.serve.server import build_state, make_app
    from tandem.serve.state import ServeSettings

    state = build_state({"main": model}, ServeSettings(max_batch_size=32, cache_size=0), name="bench")
    app = make_app(state)

    def start() -> None:
        loop = asyncio.get_running_loop()

        def answered(row, stream: bool = False) -> Job:
            future = loop.create_future()
            future.set_result(RowResult(token_ids=[16, 17, 18], finish_reason="stop", text="104"))
            return Job(row=row, future=future)

        for arm in state.loaded.values():
            arm.batcher.start()
            arm.batcher.submit = answered
        state.ready = True

    return app, start


async def request(app, i: int) -> None:
    """One ``POST /v1/completions`` through ``app``; raises unless it answers 200."""
    body = json.dumps({"prompt": f"{i}+{i}=", "max_tokens": 16, "temperature": 0.8}).encode()
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "root_path": "",
        "query_string": b"",
        "headers": [*headers, (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        if messages:
            return messages.pop()
        await asyncio.sleep(3600)  # the client stays connected
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    if sent[0]["status"] != 200:
        raise RuntimeError(f"status {sent[0]['status']}: {sent[-1].get('body', b'')[:200]!r}")


async def run(app, start, rounds: int, requests: int, profile: bool) -> list[float]:
    """Thread CPU microseconds per request of each round (after a warm-up)."""
    start()
    for i in range(64):
        await request(app, i)
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile(time.thread_time)
        profiler.enable()
    per_request = []
    for _ in range(rounds):
        started = time.thread_time()
        for k in range(0, requests, 32):
            await asyncio.gather(*(request(app, k + j) for j in range(32)))
        per_request.append(1e6 * (time.thread_time() - started) / requests)
    if profiler is not None:
        import pstats

        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(40)
    return per_request


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="model, export or run folder")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=1024, help="requests per round")
    parser.add_argument("--profile", action="store_true", help="cProfile the rounds (slower)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    app, start = build(args.model)
    try:
        import uvloop

        runner = uvloop.run  # the loop uvicorn runs the server on when uvloop is installed
    except ImportError:
        runner = asyncio.run
    times = runner(run(app, start, args.rounds, args.requests, args.profile))
    print(
        f"event-loop CPU per request: median {statistics.median(times):.0f} us, min {min(times):.0f} us "
        f"({len(times)} rounds of {args.requests}: {', '.join(f'{t:.0f}' for t in times)})"
    )
    print(f"load average (1, 5, 15 min): {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
