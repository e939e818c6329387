"""``tandem serve`` (OpenAI-compatible server) and ``tandem data export-feedback``."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.markup import escape

from tandem.cli.app import app, data_app, out, user_errors
from tandem.cli.engines import (
    DEFAULT_ENGINE_NAME,
    EngineOptions,
    ServeEngineName,
    check_engine,
    engine_options,
)
from tandem.data.outputs import BEST_RECORD
from tandem.errors import ConfigError, first_line

T = TypeVar("T")


def _arms(model: str, arm: list[str] | None) -> dict[str, str]:
    """``MODEL_OR_RUN`` is arm ``main``; ``--arm name=path`` adds more (A/B)."""
    arms = {"main": model}
    for item in arm or []:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"'{item}' is not NAME=PATH", where="--arm")
        arms[name] = path
    return arms


def _split(split: str | None) -> dict[str, float] | None:
    if not split:
        return None
    weights = {}
    for item in split.split(","):
        name, sep, value = item.partition("=")
        try:
            weights[name] = float(value)
        except ValueError:
            raise ConfigError(f"'{item}' is not NAME=WEIGHT", where="--split") from None
        if not sep:
            raise ConfigError(f"'{item}' is not NAME=WEIGHT", where="--split")
    return weights


def _keys(api_key: list[str] | None, admin_key: str | None) -> tuple[list[str], str | None]:
    """The API keys (flags, then ``TANDEM_API_KEYS``; blank entries of the variable are skipped) and the
    admin key; ConfigError naming the flag or variable for an empty or whitespace key."""
    from tandem.serve.state import check_key

    for key in api_key or []:
        check_key(key, "--api-key")
    env_keys = [k.strip() for k in os.environ.get("TANDEM_API_KEYS", "").split(",") if k.strip()]
    for key in env_keys:
        check_key(key, "TANDEM_API_KEYS")
    if admin_key is not None:
        check_key(admin_key, "--admin-key")
    return list(api_key or []) + env_keys, admin_key or os.environ.get("TANDEM_ADMIN_KEY", "").strip() or None


def best_model_note(model: str) -> str | None:
    """A line for a run folder served at its latest checkpoint while it also kept a ``best/`` model
    (``checkpoint.best_metric``): which one is served and how to serve the other."""
    run = Path(model)
    record = run / "best" / BEST_RECORD
    if not (run / "checkpoints").is_dir() or not record.is_file():
        return None
    try:
        best = json.loads(record.read_text(encoding="utf-8"))
        what = f"{best['metric']} {float(best['value']):.4g} at step {int(best['step'])}"
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (
        f"note: serving the run's latest checkpoint; its best evaluation ({escape(what)}) is kept in "
        f"{escape(str(run / 'best'))} — pass that folder to serve it"
    )


@app.command()
@user_errors
def serve(
    model: Annotated[str, typer.Argument(help="HF model folder, int8 export folder, or a run folder.")],
    host: Annotated[str, typer.Option(help="Bind address (non-loopback needs API keys).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8000,
    api_key: Annotated[
        list[str] | None, typer.Option(help="API key (repeatable); also TANDEM_API_KEYS.")
    ] = None,
    admin_key: Annotated[str | None, typer.Option(help="Admin API key; also TANDEM_ADMIN_KEY.")] = None,
    arm: Annotated[list[str] | None, typer.Option(help="Extra A/B arm NAME=PATH (repeatable).")] = None,
    split: Annotated[str | None, typer.Option(help="Traffic split, e.g. main=0.9,b=0.1.")] = None,
    name: Annotated[str | None, typer.Option(help="Model id clients send (default: folder name).")] = None,
    max_batch_size: Annotated[int, typer.Option(help="Rows generated together at most.")] = 32,
    max_wait_ms: Annotated[float, typer.Option(help="How long a batch waits for more requests.")] = 10.0,
    max_queue: Annotated[int, typer.Option(help="Waiting rows before answering 429.")] = 256,
    cache_size: Annotated[int, typer.Option(help="LRU entries for temperature-0 responses (0: off).")] = 1024,
    max_tokens_limit: Annotated[int, typer.Option(help="Largest max_tokens accepted.")] = 512,
    max_body_bytes: Annotated[int, typer.Option(help="Largest request body (413 beyond).")] = 1 << 20,
    feedback_db: Annotated[
        str | None, typer.Option(help="SQLite file for /v1/feedback and recorded chat conversations.")
    ] = None,
    tool_format: Annotated[
        str,
        typer.Option(help="Tool-call format (hermes, plain) when the chat template does not render tools."),
    ] = "hermes",
    ssl_certfile: Annotated[str | None, typer.Option(help="TLS certificate (PEM).")] = None,
    ssl_keyfile: Annotated[str | None, typer.Option(help="TLS private key (PEM).")] = None,
    threads: Annotated[int, typer.Option(help="torch threads for generation.")] = 0,
    workers: Annotated[
        int,
        typer.Option(help="uvicorn worker processes behind one port (each with its own engine replicas)."),
    ] = 1,
    read_timeout: Annotated[
        float, typer.Option(help="Seconds a request's head, then its body, may take to arrive.")
    ] = 30.0,
    max_connections: Annotated[
        int, typer.Option(help="Open connections (or running requests) beyond which requests get 503.")
    ] = 1024,
    engine: ServeEngineName = DEFAULT_ENGINE_NAME,
    engine_option: EngineOptions = None,
    min_replicas: Annotated[int, typer.Option(help="Engine replicas per arm, kept at least.")] = 1,
    max_replicas: Annotated[
        int, typer.Option(help="Engine replicas per arm, at most (above --min-replicas: autoscaling).")
    ] = 1,
    scale_up_queue: Annotated[
        int | None,
        typer.Option(
            help="Add a replica when more rows than this wait per replica (default: --max-batch-size).",
            show_default=False,
        ),
    ] = None,
    scale_down_idle_s: Annotated[
        float, typer.Option(help="Release a replica idle this many seconds (down to --min-replicas).")
    ] = 60.0,
) -> None:
    """Serve a model with the OpenAI API (completions, chat, streaming), /predict, /metrics and A/B arms.

    Example: tandem serve runs/grpo --port 8000   then   curl -X POST localhost:8000/predict -d '{"text": "1+2="}'

    Autoscaling: tandem serve runs/grpo --engine vllm --min-replicas 1 --max-replicas 4 --scale-down-idle-s 120
    """
    from tandem.serve import require_serve_deps

    require_serve_deps()
    import torch

    from tandem.serve.server import bind_port, build_state, check_bind, check_tls, run_server
    from tandem.serve.state import ServeSettings

    # every flag is checked, and the port bound, before a model loads: a mistake costs no load time
    # and nothing is announced that will not be served
    if workers < 1:
        raise ConfigError(f"must be >= 1, got {workers}", where="--workers")
    if threads < 0:
        raise ConfigError(f"must be >= 0 (0: torch's default), got {threads}", where="--threads")
    keys, admin_key = _keys(api_key, admin_key)
    settings = ServeSettings(
        max_batch_size=max_batch_size,
        max_wait_ms=max_wait_ms,
        max_queue=max_queue,
        cache_size=cache_size,
        max_tokens_limit=max_tokens_limit,
        max_body_bytes=max_body_bytes,
        api_keys=keys,
        admin_key=admin_key,
        feedback_db=feedback_db,
        tool_format=tool_format,
        read_timeout_s=read_timeout,
        max_connections=max_connections,
        engine=check_engine(engine),
        engine_options=engine_options(engine_option),
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        scale_up_queue=scale_up_queue,
        scale_down_idle_s=scale_down_idle_s,
    )
    arms, weights = _arms(model, arm), _split(split)
    check_bind(host, bool(keys))
    check_tls(ssl_certfile, ssl_keyfile)
    sock = bind_port(host, port)
    port = sock.getsockname()[1]  # the free port that --port 0 picked
    try:  # closed however this ends (the servers also close it when they stop)
        if threads:
            torch.set_num_threads(threads)
        if note := best_model_note(model):
            out.print(note)
        if workers > 1:
            from tandem.serve.server import run_replicas

            out.print(f"serving {escape(model)} with {workers} replicas on {host}:{port}")
            display = name or Path(model).resolve().name
            run_replicas(
                arms, settings, display, weights, host, port, workers, ssl_certfile, ssl_keyfile, sock=sock
            )
            return
        state = build_state(arms, settings, name=name, split=weights)
        scheme = "https" if ssl_certfile else "http"
        replicas = f"{min_replicas}" if max_replicas == min_replicas else f"{min_replicas}..{max_replicas}"
        out.print(
            f"serving [bold]{escape(state.name)}[/] arms={dict(state.router.split)} engine={escape(engine)} "
            f"replicas={replicas} on {scheme}://{host}:{port}"
        )
        run_server(state, host, port, ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile, sock=sock)
    finally:
        sock.close()


def _check_export(db: Path, out_file: Path) -> None:
    """The feedback database exists, and ``--out`` is a file that is not the database itself."""
    from tandem.data.outputs import check_output_file

    if db.is_dir():
        raise ConfigError(
            "is a folder, not a feedback database (the file given to --feedback-db)", where=str(db)
        )
    if not db.is_file():
        raise ConfigError("feedback database does not exist", where=str(db))
    check_output_file(out_file, sources=(db,), where="--out")


def _export(db: Path, write: Callable[[], T]) -> T:
    """Run an export of ``db``; a file that is not a feedback database is one line naming it."""
    import sqlite3

    try:
        return write()
    except (sqlite3.Error, ValueError) as err:
        raise ConfigError(f"cannot export: {first_line(err)}", where=str(db)) from None


@data_app.command("export-feedback")
@user_errors
def export_feedback(
    db: Annotated[Path, typer.Argument(help="The SQLite file given to tandem serve --feedback-db.")],
    out_file: Annotated[Path, typer.Option("--out", help="Preference JSONL (prompt/chosen/rejected).")],
    threshold: Annotated[float, typer.Option(help="Ratings >= this are good, below bad.")] = 0.5,
    as_sent: Annotated[
        bool,
        typer.Option(
            "--as-sent", help="Every pair as users sent it: no merging of repeats, no vote between reversals."
        ),
    ] = False,
) -> None:
    """Write user feedback as a preference dataset that tandem dpo / tandem rm read.

    Rows comparing the same two answers to one prompt become one row, in the direction most users chose
    (a tie drops them); --as-sent keeps every row.
    """
    from tandem.serve.feedback import export_preferences

    if not math.isfinite(threshold):
        raise ConfigError(f"must be a finite number, got {threshold}", where="--threshold")
    _check_export(db, out_file)
    votes = _export(db, lambda: export_preferences(db, out_file, threshold, as_sent=as_sent))
    merged = ""
    if votes.repeats or votes.outvoted or votes.tied:
        merged = (
            f" ({votes.repeats} repeated rows merged, {votes.outvoted} outvoted and {votes.tied} tied rows "
            "dropped; --as-sent keeps them)"
        )
    out.print(f"wrote {len(votes)} preference rows to {escape(str(out_file))}{merged}")


@data_app.command("export-conversations")
@user_errors
def export_conversations(
    db: Annotated[Path, typer.Argument(help="The SQLite file given to tandem serve --feedback-db.")],
    out_file: Annotated[
        Path, typer.Option("--out", help="JSONL: messages + tools, and the exact prompt/completion text.")
    ],
) -> None:
    """Write the chat conversations a server recorded (tool calls included) as training rows."""
    from tandem.serve.feedback import export_conversations as export

    _check_export(db, out_file)
    n = _export(db, lambda: export(db, out_file))
    out.print(f"wrote {n} conversation rows to {escape(str(out_file))}")


@app.command()
@user_errors
def loadtest(
    url: Annotated[str, typer.Argument(help="Server base URL, e.g. http://127.0.0.1:8000.")],
    concurrency: Annotated[int, typer.Option(help="Concurrent closed-loop clients.")] = 8,
    requests: Annotated[int, typer.Option(help="Stop after this many requests.")] = 200,
    duration: Annotated[float, typer.Option(help="Stop after this many seconds.")] = 30.0,
    prompt: Annotated[str, typer.Option(help="Prompt of every request.")] = "12+34=",
    max_tokens: Annotated[int, typer.Option(help="max_tokens of every request.")] = 16,
    temperature: Annotated[float, typer.Option(help="Sampling temperature (0 hits the cache).")] = 0.8,
    api_key: Annotated[str | None, typer.Option(help="API key; also TANDEM_API_KEY.")] = None,
    allow_host: Annotated[str | None, typer.Option(help="Allow this non-loopback host.")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the result as JSON.")] = None,
) -> None:
    """Load-test a tandem (or any OpenAI-compatible) server: QPS, p50/p95/p99 and errors by status.

    Example: tandem loadtest http://127.0.0.1:8000 --concurrency 32 --requests 1000 --duration 60
    """
    import asyncio

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn
    from rich.table import Table

    from tandem.serve.loadtest import check_target, run_load
    from tandem.utils.io import atomic_write_json

    check_target(url, allow_host)
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": temperature}
    key = api_key or os.environ.get("TANDEM_API_KEY")
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=out,
    ) as bar:
        task = bar.add_task("requests", total=requests)
        result = asyncio.run(
            run_load(
                url,
                concurrency=concurrency,
                max_requests=requests,
                duration_s=duration,
                body=body,
                api_key=key,
                on_done=lambda n: bar.advance(task, n),
            )
        )
    table = Table(title=f"tandem loadtest {escape(url)}")
    for col in ("concurrency", "requests", "ok", "QPS", "p50 ms", "p95 ms", "p99 ms", "errors by status"):
        table.add_column(col)
    errors = ", ".join(f"{k}: {v}" for k, v in sorted(result.errors_by_status.items())) or "none"
    table.add_row(
        str(result.concurrency),
        str(result.requests),
        str(result.ok),
        f"{result.qps:.1f}",
        f"{result.p50_ms:.0f}",
        f"{result.p95_ms:.0f}",
        f"{result.p99_ms:.0f}",
        errors,
    )
    out.print(table)
    if json_out is not None:
        atomic_write_json(json_out, result.as_dict())
