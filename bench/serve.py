"""Serving QPS under 32 concurrent clients on loopback against `tandem serve`.

Default: dynamic batching vs batch-size-1. Both servers are the same `tandem serve` process (own process,
1 torch thread... or --threads) on the same tiny model; only --max-batch-size differs (32 vs 1).

``--models NAME=FOLDER,...``: one dynamic-32 server per model folder (HF, INT8 export or run folder),
e.g. a teacher against its distilled student in fp32 and INT8; ratios are against the first.

Rounds alternate between the servers (interleaved, the order reversed every other round) and each round
runs for --seconds. Sampled requests (temperature 0.8) so the greedy cache never answers. Prints a table,
the load average, and a final ratio line.

    .venv/bin/python bench/serve.py --seconds 20 --rounds 2
    .venv/bin/python bench/serve.py --models teacher=runs/quickstart,int8=exports/student-int8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def mean_batch(url: str) -> float:
    """Mean rows per generated batch, from the server's Prometheus metrics."""
    values = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(("tandem_batch_size_sum", "tandem_batch_size_count")):
            values[line.split("{")[0]] = float(line.split()[-1])
    return values.get("tandem_batch_size_sum", 0.0) / max(values.get("tandem_batch_size_count", 0.0), 1.0)


def start_server(model: str, batch: int, threads: int, wait_ms: float) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [
        str(Path(sys.executable).parent / "tandem"),
        "serve",
        model,
        "--port",
        str(port),
        "--max-batch-size",
        str(batch),
        "--max-wait-ms",
        str(wait_ms),
        "--max-queue",
        "1024",
        "--threads",
        str(threads),
        "--cache-size",
        "0",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
    log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the server; a pipe could fill
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300  # a loaded machine starts slowly
    while time.time() < deadline:
        try:
            if httpx.get(url + "/ready", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    log.seek(0)
    raise RuntimeError(f"server for {model} did not start: {log.read().decode()[-500:]}")


def _load_summary(latencies: list[float], errors: dict, elapsed: float) -> dict:
    """One load run's figures: completed requests, QPS, p50/p99 latency, errors by status."""
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [float("nan")] * 99
    return {
        "ok": len(latencies),
        "qps": len(latencies) / elapsed,
        "p50": q[49],
        "p99": q[98],
        "errors": sum(errors.values()),
        "by_status": errors,
    }


async def load(url: str, clients: int, seconds: float, max_tokens: int) -> dict:
    """``clients`` closed-loop clients for ``seconds``: latencies and status counts."""
    latencies: list[float] = []
    errors: dict[str, int] = {}
    stop_at = time.perf_counter() + seconds

    async def client(i: int, http: httpx.AsyncClient) -> None:
        n = 0
        while time.perf_counter() < stop_at:
            body = {"prompt": f"{i}+{n}=", "max_tokens": max_tokens, "temperature": 0.8}
            started = time.perf_counter()
            try:
                r = await http.post("/v1/completions", json=body)
                key = None if r.status_code == 200 else str(r.status_code)
            except httpx.HTTPError as err:
                key = type(err).__name__
            if key is None:
                latencies.append(time.perf_counter() - started)
            else:
                errors[key] = errors.get(key, 0) + 1
            n += 1

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(i, http) for i in range(clients)))
        elapsed = time.perf_counter() - started
    return _load_summary(latencies, errors, elapsed)


async def load_raw(url: str, clients: int, seconds: float, max_tokens: int) -> dict:
    """:func:`load` with a minimal HTTP/1.1 keep-alive client on asyncio streams instead of httpx.

    httpx costs about as much CPU per request as the server itself (measured 5.7-6.0 ms against the
    server's 5.0-5.7 ms), so on a shared machine the load generator, not the server, set the QPS of
    every arm alike. This client parses only the status line and Content-Length."""
    host, port = url.removeprefix("http://").split(":")
    latencies: list[float] = []
    errors: dict[str, int] = {}
    stop_at = time.perf_counter() + seconds
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"

    async def client(i: int) -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        n = 0
        try:
            while time.perf_counter() < stop_at:
                body = json.dumps({"prompt": f"{i}+{n}=", "max_tokens": max_tokens, "temperature": 0.8})
                started = time.perf_counter()
                writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n{body}".encode())
                lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                status = lines[0].split(" ", 2)[1]
                length = next(
                    int(x.split(":", 1)[1]) for x in lines if x.lower().startswith("content-length:")
                )
                await reader.readexactly(length)
                if status == "200":
                    latencies.append(time.perf_counter() - started)
                else:
                    errors[status] = errors.get(status, 0) + 1
                n += 1
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    elapsed = time.perf_counter() - started
    return _load_summary(latencies, errors, elapsed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-wait-ms", type=float, default=20.0)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument(
        "--client",
        choices=("httpx", "raw"),
        default="httpx",
        help="load generator (raw: lean asyncio HTTP/1.1)",
    )
    parser.add_argument("--models", default="", help="NAME=FOLDER,... : compare these models (batch 32)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tandem-bench-serve-") as tmp:
        bench(args, tmp)


def parse_models(spec: str) -> dict[str, str]:
    """``NAME=FOLDER,...`` -> {name: folder}, in order."""
    models = {}
    for item in spec.split(","):
        name, sep, folder = item.partition("=")
        if not sep or not name or not folder:
            sys.exit(f"--models: expected NAME=FOLDER, got {item!r}")
        models[name] = folder
    return models


def bench(args: argparse.Namespace, tmp: str) -> None:
    """Start the servers (both batch sizes on a fresh tiny model in ``tmp``, or one per ``--models``
    folder), load them interleaved, print the table."""
    if args.models:
        setups = [(name, folder, 32) for name, folder in parse_models(args.models).items()]
    else:
        from tandem.models import init_tiny_model

        model = str(
            init_tiny_model(
                Path(tmp) / "tiny",
                hidden_size=args.hidden_size,
                num_layers=args.num_layers,
                num_heads=4,
                seed=0,
            )
        )
        setups = [("batch-1", model, 1), ("dynamic-32", model, 32)]
    drive = load_raw if args.client == "raw" else load
    servers = {
        name: start_server(folder, batch, args.threads, args.max_wait_ms) for name, folder, batch in setups
    }
    rows: dict[str, list[dict]] = {name: [] for name in servers}
    batch_means: dict[str, float] = {}
    rss = {name: [_rss_mb(p.pid)] for name, (p, _) in servers.items()}
    try:
        for name, (_, url) in servers.items():  # warm-up
            asyncio.run(drive(url, args.clients, 2.0, args.max_tokens))
            rss[name].append(_rss_mb(servers[name][0].pid))
        for r in range(args.rounds):
            order = list(servers) if r % 2 == 0 else list(reversed(servers))
            for name in order:
                proc, url = servers[name]
                cpu, own = cpu_seconds(proc.pid), time.process_time()
                result = asyncio.run(drive(url, args.clients, args.seconds, args.max_tokens))
                result["cpu_ms"] = 1000 * (cpu_seconds(proc.pid) - cpu) / max(result["ok"], 1)
                result["client_cpu_ms"] = 1000 * (time.process_time() - own) / max(result["ok"], 1)
                rows[name].append(result)
                load_avg = os.getloadavg()[0]
                print(
                    f"round {r + 1} {name}: {result['qps']:.1f} QPS, server CPU {result['cpu_ms']:.1f} ms "
                    f"per request, client CPU {result['client_cpu_ms']:.1f} ms (load {load_avg:.1f})",
                    file=sys.stderr,
                )
        for name, (proc, url) in servers.items():
            rss[name].append(_rss_mb(proc.pid))
            batch_means[name] = mean_batch(url)
    finally:
        for proc, _ in servers.values():
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
    print(
        "| server | QPS | server CPU ms / request | p50 ms | p99 ms | ok | errors | mean batch "
        "| RSS start/warm/end MB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    summary = {}
    for name, results in rows.items():
        qps = statistics.mean(x["qps"] for x in results)
        p50 = statistics.mean(x["p50"] for x in results) * 1000
        p99 = max(x["p99"] for x in results) * 1000
        errs = sum(x["errors"] for x in results)
        cpu_ms = statistics.mean(x["cpu_ms"] for x in results)
        summary[name] = (qps, p99)
        start, warm, end = rss[name]
        print(
            f"| {name} | {qps:.1f} | {cpu_ms:.1f} | {p50:.0f} | {p99:.0f} | {sum(x['ok'] for x in results)} | {errs} "
            f"| {batch_means[name]:.1f} | {start:.0f} / {warm:.0f} / {end:.0f} |"
        )
    print(f"load average at the end (1, 5, 15 min): {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if args.models:
        first, *others = summary
        for name in others:
            print(
                f"ratio: {name} {summary[name][0] / summary[first][0]:.2f}x the QPS of {first}; p99 "
                f"{summary[name][1]:.0f} ms vs {summary[first][1]:.0f} ms"
            )
        return
    ratio = summary["dynamic-32"][0] / summary["batch-1"][0]
    print(
        f"ratio: dynamic batching {ratio:.2f}x the QPS of batch-size-1; p99 {summary['dynamic-32'][1]:.0f} "
        f"ms vs {summary['batch-1'][1]:.0f} ms ({args.clients} clients, {args.seconds:.0f} s x "
        f"{args.rounds} rounds each)"
    )


if __name__ == "__main__":
    main()
