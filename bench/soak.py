"""Soak: a real `tandem serve` under steady mixed load and a `tandem train` run, side by side, watched.

Starts both as subprocesses (the server on 127.0.0.1 only, with an API key, an admin key and a feedback
db), drives `--clients` closed-loop clients for `--serve-minutes` (mix in bench/soak_load.py), runs
`configs/quickstart.yaml` for `--train-steps` steps in a temporary run folder (eval, samples and
checkpoints at a modest cadence), and samples RSS and open file descriptors of each process tree every
`--interval` seconds. Prints per process: duration, RSS start/end/max, fitted growth in MB/hour
(least-squares slope after the first `--warmup-fraction` of the samples), fds and their growth, crashes
and errors; then the request outcomes and a line against the target (<= 10 MB/hour, zero crashes).

    nice -n 5 .venv/bin/python bench/soak.py --serve-minutes 1 --train-steps 50   # check the script
    nice -n 5 .venv/bin/python bench/soak.py --snapshot --json soak.json          # 30 min + 2000 steps

`--snapshot` runs the committed tree (`git archive HEAD`), not the working tree: in a checkout that
others edit, a server started mid-edit measured 30,000 NameError 500s instead of the code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
from soak_load import drive
from soak_stats import Sample, sample_tree, summarise

ROOT = Path(__file__).resolve().parents[1]
TANDEM = str(Path(sys.executable).parent / "tandem")
API_KEY, ADMIN_KEY = "soak-user-key", "soak-admin-key"
TARGET_MB_PER_H = 10.0


class Watched:
    """A subprocess under watch: its samples, when it was expected to stop, and how it ended."""

    def __init__(self, name: str, proc: subprocess.Popen, log: Path) -> None:
        self.name, self.proc, self.log = name, proc, log
        self.samples: list[Sample] = []
        self.stop_requested = False
        self.rc: int | None = None
        self.errors = 0
        self.tail = ""

    def crashed(self) -> bool:
        """Exited on its own with a failure (training), or at all before we stopped it (server)."""
        if self.rc is None:
            return False
        if self.name == "serve":
            return not self.stop_requested or self.rc not in (0, -signal.SIGINT)
        return self.rc != 0

    def log_errors(self) -> int:
        """Tracebacks and ERROR lines in the process's log."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return text.count("Traceback (most recent call last)") + text.count(" ERROR ")


class Sampler(threading.Thread):
    """Samples every watched process tree every ``interval`` seconds until stopped."""

    def __init__(self, watched: list[Watched], interval: float, t0: float) -> None:
        super().__init__(daemon=True)
        self.watched, self.interval, self.t0 = watched, interval, t0
        self.done = threading.Event()

    def run(self) -> None:
        # The first reading comes one interval in: a process sampled right after exec reads ~1 MB.
        while not self.done.wait(self.interval):
            for w in self.watched:
                if w.proc.poll() is None:
                    s = sample_tree(w.proc.pid, time.monotonic() - self.t0)
                    if s is not None:
                        w.samples.append(s)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(src: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if src != ROOT:  # a snapshot: its `tandem` package comes first on the path
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), env.get("PYTHONPATH")]))
    return env


def snapshot(tmp: Path) -> tuple[Path, str]:
    """Export the committed tree (``git archive HEAD``) to ``tmp/src``: the processes under test then run
    that code, so edits to the working tree during a long soak cannot change what is measured."""
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    src = tmp / "src"
    src.mkdir()
    archive = subprocess.Popen(["git", "archive", "HEAD"], cwd=ROOT, stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(src)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise SystemExit("soak: git archive HEAD failed")
    return src, commit


def start_server(model: str, tmp: Path, feedback: bool, src: Path) -> tuple[Watched, str]:
    """`tandem serve` on a free loopback port with keys (and a feedback db); waits until /ready."""
    port = _free_port()
    cmd = [TANDEM, "serve", model, "--host", "127.0.0.1", "--port", str(port), "--threads", "1"]
    cmd += ["--api-key", API_KEY, "--admin-key", ADMIN_KEY, "--max-queue", "512"]
    if feedback:
        cmd += ["--feedback-db", str(tmp / "feedback.db")]
    log = tmp / "serve.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, env=_env(src), stdout=fh, stderr=subprocess.STDOUT, cwd=src)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return Watched("serve", proc, log), url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"soak: server did not become ready: {log.read_text()[-800:]}")


def start_training(tmp: Path, steps: int, config: str, src: Path) -> Watched:
    """`tandem train CONFIG` for ``steps`` steps in a fresh run folder under ``tmp``."""
    every = max(10, steps // 10)
    cmd = [TANDEM, "train", config, f"trainer.total_steps={steps}", f"run.output_dir={tmp / 'run'}"]
    cmd += [f"monitor.eval_every={every}", f"monitor.sample_every={every}"]
    cmd += [f"checkpoint.every={max(25, steps // 4)}", "monitor.progress=false"]
    log = tmp / "train.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, env=_env(src), stdout=fh, stderr=subprocess.STDOUT, cwd=src)
    return Watched("train", proc, log)


def stop_server(w: Watched) -> None:
    """SIGINT (uvicorn's graceful shutdown), then SIGKILL after 30 s."""
    w.stop_requested = True
    if w.proc.poll() is None:
        w.proc.send_signal(signal.SIGINT)
    try:
        w.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        w.proc.kill()
        w.proc.wait()
    w.rc = w.proc.returncode


def wait_training(w: Watched, timeout_s: float) -> None:
    """Wait for training to finish by itself; past ``timeout_s`` kill it (counted as a crash)."""
    try:
        w.proc.wait(timeout=max(timeout_s, 1))
    except subprocess.TimeoutExpired:
        print(f"soak: training still running after {timeout_s:.0f} s; killing it", file=sys.stderr)
        w.proc.kill()
        w.proc.wait()
    w.rc = w.proc.returncode


def build_model(tmp: Path, src: Path) -> str:
    """`tandem init-model`: the tiny char-level Llama the other benches use (hidden 128, 4 layers, 1.06M
    params, seed 0), built by the code under test."""
    out = tmp / "tiny"
    cmd = [TANDEM, "init-model", str(out), "--hidden-size", "128", "--num-layers", "4", "--seed", "0"]
    subprocess.run(cmd, env=_env(src), cwd=src, check=True, stdout=subprocess.DEVNULL)
    return str(out)


def run(args: argparse.Namespace, tmp: Path) -> dict:
    """Start, load, wait, stop; returns the raw result (samples, outcomes, exit codes)."""
    src, commit = snapshot(tmp) if args.snapshot else (ROOT, "working tree")
    print(f"soak: measuring {commit} ({src})", file=sys.stderr)
    t0 = time.monotonic()
    watched: list[Watched] = []
    if args.train_steps > 0:
        watched.append(start_training(tmp, args.train_steps, args.train_config, src))
    server, url = None, ""
    if args.serve_minutes > 0:
        model = args.model or build_model(tmp, src)
        server, url = start_server(model, tmp, feedback=not args.no_feedback, src=src)
        watched.append(server)
    sampler = Sampler(watched, args.interval, t0)
    sampler.start()
    load = None
    try:
        if server is not None:
            load = asyncio.run(
                drive(
                    url,
                    API_KEY,
                    args.clients,
                    args.serve_minutes * 60,
                    feedback=not args.no_feedback,
                    alive=lambda: server.proc.poll() is None,
                    seed=args.seed,
                )
            )
            stop_server(server)
        for w in watched:
            if w.name == "train":
                wait_training(w, args.train_timeout_minutes * 60 - (time.monotonic() - t0))
    finally:
        sampler.done.set()
        sampler.join()
        for w in watched:
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()
            w.rc = w.proc.returncode if w.rc is None else w.rc
            w.errors = w.log_errors()  # read now: the temporary folder goes away after run()
            w.tail = w.log.read_text(errors="replace")[-2000:] if w.log.exists() else ""
    return {"watched": watched, "load": load, "wall_s": time.monotonic() - t0, "commit": commit}


def report(args: argparse.Namespace, result: dict) -> dict:
    """Print the process table, the request table and the target line; returns the JSON summary."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    load = result["load"]
    by_class = Counter()
    if load is not None:
        for (_, _, cls), n in load.counts.items():
            by_class[cls] += n
    table = Table(title=f"Soak: processes (fit after the first {args.warmup_fraction:.0%} of samples)")
    for col in (
        "process",
        "duration",
        "samples",
        "RSS start/end/max MB",
        "RSS MB/h ± se",
        "fds start/end/max",
    ):
        table.add_column(col, justify="right")
    for col in ("fds/h", "crashes", "errors"):
        table.add_column(col, justify="right")
    summary: dict = {"processes": {}, "requests": {}, "wall_s": result["wall_s"], "commit": result["commit"]}
    for w in result["watched"]:
        s = summarise(w.samples, args.warmup_fraction)
        errors = w.errors
        if w.name == "serve":
            errors += by_class["5xx"] + by_class["connection"] + by_class["unexpected"]
        s.update(rc=w.rc, crashes=int(w.crashed()), errors=errors)
        summary["processes"][w.name] = s
        if not s["samples"]:
            table.add_row(w.name, "-", "0", "-", "-", "-", "-", str(s["crashes"]), str(errors))
            continue
        table.add_row(
            w.name,
            f"{s['duration_s'] / 60:.1f} min",
            str(s["samples"]),
            f"{s['rss_start_mb']:.0f} / {s['rss_end_mb']:.0f} / {s['rss_max_mb']:.0f}",
            f"{s['rss_growth_mb_per_h']:+.1f} ± {s['rss_growth_stderr']:.1f}",
            f"{s['fd_start']} / {s['fd_end']} / {s['fd_max']}",
            f"{s['fd_growth_per_h']:+.1f}",
            str(s["crashes"]),
            str(errors),
        )
    console.print(table)
    if load is not None:
        _print_requests(console, load)
        summary["requests"] = {f"{k}|{o}|{c}": n for (k, o, c), n in sorted(load.counts.items())}
        summary["request_classes"] = dict(by_class)
    _print_verdict(console, summary, by_class)
    return summary


def _print_requests(console, load) -> None:
    from rich.table import Table

    kinds = sorted({k for k, _, _ in load.counts})
    table = Table(title="Soak: requests by kind (outcome: count; * = not expected)")
    table.add_column("kind")
    table.add_column("total", justify="right")
    table.add_column("outcomes")
    for kind in kinds:
        rows = {(o, c): n for (k, o, c), n in load.counts.items() if k == kind}
        text = ", ".join(f"{o}{'' if c == 'ok' else '*'}: {n}" for (o, c), n in sorted(rows.items()))
        table.add_row(kind, str(sum(rows.values())), text)
    console.print(table)
    lat = sorted(load.latencies)
    if lat:
        console.print(
            f"200 latency p50 {lat[len(lat) // 2] * 1000:.0f} ms, p99 {lat[int(len(lat) * 0.99)] * 1000:.0f} ms"
        )


def _print_verdict(console, summary: dict, by_class: Counter) -> None:
    procs = summary["processes"]
    crashes = sum(p["crashes"] for p in procs.values())
    growth = {n: p.get("rss_growth_mb_per_h", float("nan")) for n, p in procs.items()}
    met = crashes == 0 and all(g <= TARGET_MB_PER_H for g in growth.values())
    parts = ", ".join(f"{n} {g:+.1f} MB/h" for n, g in growth.items())
    shortest = min((p.get("duration_s", 0.0) for p in procs.values()), default=0.0)
    caveat = " (under 10 minutes of samples: the growth fit is start-up noise)" if shortest < 600 else ""
    console.print(
        f"target (<= {TARGET_MB_PER_H:.0f} MB/hour RSS growth, 0 crashes): {'MET' if met else 'NOT MET'}{caveat} "
        f"— {parts}; crashes {crashes}; requests ok {by_class['ok']}, 5xx {by_class['5xx']}, connection "
        f"errors {by_class['connection']}, unexpected {by_class['unexpected']}"
    )
    summary["target_met"] = met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder to serve (default: a fresh tiny Llama)")
    parser.add_argument("--serve-minutes", type=float, default=30.0, help="0: no server")
    parser.add_argument("--train-steps", type=int, default=2000, help="0: no training")
    parser.add_argument("--train-config", default="configs/quickstart.yaml")
    parser.add_argument("--train-timeout-minutes", type=float, default=240.0)
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--warmup-fraction", type=float, default=0.1)
    parser.add_argument("--no-feedback", action="store_true", help="serve without a feedback db")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--snapshot",
        action="store_true",
        help="run the committed tree (git archive HEAD) instead of the working tree, which others may edit",
    )
    parser.add_argument("--json", help="write raw samples and the summary here")
    parser.add_argument("--workdir", help="keep the run folder, logs and db here (default: a temp dir)")
    args = parser.parse_args()
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
        result = run(args, Path(args.workdir).resolve())
    else:
        with tempfile.TemporaryDirectory(prefix="tandem-soak-") as tmp:
            result = run(args, Path(tmp))
    for w in result["watched"]:
        if w.crashed() or w.errors:
            print(f"--- {w.name} log tail (rc {w.rc}) ---\n{w.tail}", file=sys.stderr)
    summary = report(args, result)
    if args.json:
        raw = {w.name: [s.__dict__ for s in w.samples] for w in result["watched"]}
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "summary": summary, "samples": raw}, indent=1)
        )
    sys.exit(0 if summary["target_met"] else 1)


if __name__ == "__main__":
    main()
