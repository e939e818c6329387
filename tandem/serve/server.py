"""Build a server state from model folders and run it under uvicorn.

Without API keys the server refuses any bind address but loopback (an open model endpoint on a public
interface is a mistake we do not let through). Only this package imports uvicorn.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
from pathlib import Path

from tandem.errors import ConfigError, MissingDependencyError, first_line
from tandem.serve import heap
from tandem.serve.router import build_arm
from tandem.utils.net import is_loopback_host

logger = logging.getLogger(__name__)


def build_state(
    arms: dict[str, str], settings, name: str | None = None, split: dict[str, float] | None = None
):
    """A :class:`~tandem.serve.state.ServerState` with ``arms`` (name -> model/run folder) loaded.

    The admin state starts as ``arms`` with ``split``; with ``settings.state_dir`` (replicas) it is the
    shared file there, which may already have moved on (a replica restarted after admin changes: it
    catches up when serving starts)."""
    from tandem.serve import admin_state
    from tandem.serve.state import ServerState

    first = next(iter(arms.values()))
    state = ServerState(settings, name or Path(first).resolve().name)
    try:
        start = admin_state.initial(arms, split)
    except admin_state.SplitError as err:
        raise ConfigError(str(err), where="--split") from None
    if settings.feedback_db:  # opened before the models load: a bad path fails fast, not after minutes
        state.feedback = open_feedback(settings.feedback_db)
    for arm_name, path in arms.items():
        state.loaded[start.current.arms[arm_name]] = build_arm(state, arm_name, path)
    state.store = (
        admin_state.FileStore(settings.state_dir) if settings.state_dir else admin_state.MemoryStore(start)
    )
    state.router.show(start.current, state.loaded)
    state.applied = start.version
    return state


def open_feedback(path: str):
    """The :class:`~tandem.serve.feedback.FeedbackStore` at ``path``, created if missing; ConfigError
    naming ``--feedback-db`` where SQLite cannot open or create a database there (a folder, a file that
    is not a database, a read-only place) instead of a ``sqlite3`` traceback."""
    import sqlite3

    from tandem.serve.feedback import FeedbackStore

    try:
        return FeedbackStore(path)
    except (sqlite3.Error, OSError) as err:
        raise ConfigError(
            f"cannot open {path} as a SQLite database: {first_line(err)}", where="--feedback-db"
        ) from None


def make_app(state):
    """The ASGI app over ``state``: the routes (:mod:`tandem.serve.routes`, :mod:`tandem.serve.admin`)
    inside the middleware (:mod:`tandem.serve.middleware`), with a lifespan that starts the batchers,
    catches up with the admin state and marks the server ready. The generation POSTs reach their
    endpoints through the same middleware but past FastAPI (:class:`~tandem.serve.direct.Front`)."""
    from fastapi import FastAPI

    from tandem.serve.admin import register_admin, sync
    from tandem.serve.app import install_error_handlers
    from tandem.serve.direct import Direct, Front
    from tandem.serve.middleware import BodyLimit, Gate
    from tandem.serve.routes import generation_endpoints, register_routes

    app = FastAPI(title="Tandem", version="1", docs_url=None, redoc_url=None)
    app.state.tandem = state
    install_error_handlers(app)
    endpoints = generation_endpoints(state)
    register_routes(app, state, endpoints)
    register_admin(app, state)
    s = state.settings
    body = {"limit": s.max_body_bytes, "timeout_s": s.read_timeout_s}
    app.add_middleware(BodyLimit, **body)
    paths = {route.path for route in app.routes}
    gate = {"api_keys": s.api_keys, "metrics": state.metrics, "paths": paths, "before": lambda: sync(state)}
    app.add_middleware(Gate, **gate)
    limited = BodyLimit(Direct(app, endpoints), **body)  # the generation POSTs' own chain (Front)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        for arm in state.loaded.values():
            arm.batcher.start()
            state.batchers.append(arm.batcher)
        sync(state)
        state.ready = True
        try:
            yield
        finally:
            state.ready = False
            for batcher in state.batchers:
                await batcher.stop()
            heap.unfreeze()  # the process may now tear down as usual (heap.py)

    app.router.lifespan_context = lifespan
    return Front(app, Gate(limited, **gate), set(endpoints))


def check_bind(host: str, has_keys: bool) -> None:
    """ConfigError when binding ``host`` without API keys would expose the model beyond loopback."""
    if has_keys:
        return
    if not is_loopback_host(host):
        raise ConfigError(
            f"refusing to bind {host} without API keys",
            where="--host",
            hint="set --api-key / TANDEM_API_KEYS or bind 127.0.0.1",
        )


MAX_PORT = 65535
STARTUP_FAILURE = 3  # uvicorn's exit status when the app fails to start


def bind_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (not yet listening) for uvicorn to serve on, made as uvicorn makes
    its own (IPv6 for a host with ``:``, ``SO_REUSEADDR``). Binding before the model loads turns a port
    in use, a privileged port or an address not on this machine into one ConfigError, before anything
    starts or is announced, and tells which port ``0`` (any free port) picked; passing this very socket
    on leaves no window for another process to take the port meanwhile.

    uvicorn does not check the range itself: asyncio truncates ``99999`` to 16 bits and serves on 34463.
    """
    if not 0 <= port <= MAX_PORT:
        raise ConfigError(f"must be 0..{MAX_PORT} (0: any free port), got {port}", where="--port")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"{host}:{port} is already in use",
                where="--port",
                hint="stop what holds it or pick another port",
            ) from None
        if err.errno == errno.EACCES:
            raise ConfigError(
                f"no permission to bind {host}:{port}",
                where="--port",
                hint="ports below 1024 need privileges",
            ) from None
        raise ConfigError(f"cannot bind {host}:{port}: {first_line(err)}", where="--host") from None
    sock.set_inheritable(True)
    return sock


def app_from_env():
    """App factory for uvicorn worker processes (``--workers N``): rebuilds the state from the JSON spec
    the parent put in ``TANDEM_SERVE_SPEC`` (arms, settings, name, split). Each worker loads its own copy
    of the model and runs its own batcher; the workers share the listening socket."""
    import dataclasses

    from tandem.serve.connections import SPEC_ENV
    from tandem.serve.state import ServeSettings

    spec = json.loads(os.environ[SPEC_ENV])
    fields = {f.name for f in dataclasses.fields(ServeSettings)}
    settings = ServeSettings(**{k: v for k, v in spec["settings"].items() if k in fields})
    app = make_app(build_state(spec["arms"], settings, name=spec["name"], split=spec["split"]))
    heap.freeze()
    return app


def check_tls(certfile: str | None, keyfile: str | None) -> None:
    """ConfigError (one line) unless the TLS files exist and hold a certificate chain and its key;
    uvicorn would otherwise fail at startup with a traceback."""
    if certfile is None and keyfile is None:
        return
    if certfile is None:
        raise ConfigError("a TLS key needs its certificate", where="--ssl-keyfile", hint="add --ssl-certfile")
    for flag, path in (("--ssl-certfile", certfile), ("--ssl-keyfile", keyfile)):
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"file not found: {path}", where=flag)
    import ssl

    try:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(certfile, keyfile, password=lambda: b"")  # never prompt on a tty
    except (ssl.SSLError, OSError) as err:
        raise ConfigError(
            f"cannot load the certificate and key: {err}", where="--ssl-certfile", hint="PEM files expected"
        ) from None


def _uvicorn():
    try:
        import uvicorn
    except ImportError as err:
        raise MissingDependencyError("uvicorn", "serve") from err
    return uvicorn


def run_replicas(
    arms: dict[str, str],
    settings,
    name: str,
    split: dict[str, float] | None,
    host: str,
    port: int,
    workers: int,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
    sock: socket.socket | None = None,
) -> None:
    """Serve with ``workers`` uvicorn worker processes behind one port (replicas). The admin state they
    share lives in a temporary folder, removed when the server stops.

    ``sock`` (:func:`bind_port`; bound here when None) proves the port can be bound; it is closed just
    before uvicorn binds the same port for its workers (it takes an address, not a socket, for them).
    The feedback database is opened once here, so a bad ``--feedback-db`` fails before any worker starts.
    """
    import dataclasses
    import shutil
    import tempfile

    from tandem.serve import admin_state

    check_bind(host, bool(settings.api_keys))
    check_tls(ssl_certfile, ssl_keyfile)
    uvicorn = _uvicorn()
    from tandem.serve.connections import SPEC_ENV, uvicorn_limits

    try:
        start = admin_state.initial(arms, split)
    except admin_state.SplitError as err:
        raise ConfigError(str(err), where="--split") from None
    sock = sock or bind_port(host, port)
    try:
        if settings.feedback_db:
            open_feedback(settings.feedback_db).close()
        port = sock.getsockname()[1]  # the free port that 0 picked
    finally:
        sock.close()
    folder = tempfile.mkdtemp(prefix="tandem-serve-")
    try:
        admin_state.FileStore(folder).create(start)
        shared = dataclasses.replace(settings, state_dir=folder)
        spec = {"arms": arms, "settings": dataclasses.asdict(shared), "name": name, "split": split}
        os.environ[SPEC_ENV] = json.dumps(spec)
        uvicorn.run(
            "tandem.serve.server:app_from_env",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            ssl_certfile=ssl_certfile,
            ssl_keyfile=ssl_keyfile,
            log_level="warning",
            access_log=False,  # never logged at "warning"; off, uvicorn skips formatting each line
            timeout_graceful_shutdown=5,
            **uvicorn_limits(settings, replicas=True),
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _logs_access(log_level: str) -> bool:
    """Whether uvicorn's access log is on: only at a level that shows it (``info`` and below). Above,
    it would still format every line's client address and quoted path before dropping it."""
    return log_level.lower() in ("info", "debug", "trace")


def run_server(
    state,
    host: str,
    port: int,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
    log_level: str = "warning",
    sock: socket.socket | None = None,
) -> None:
    """Serve ``state`` with uvicorn until interrupted, on ``sock`` (:func:`bind_port`, bound here when
    None; closed when the server stops)."""
    check_bind(host, bool(state.settings.api_keys))
    check_tls(ssl_certfile, ssl_keyfile)
    uvicorn = _uvicorn()
    from tandem.serve.connections import uvicorn_limits

    sock = sock or bind_port(host, port)
    try:
        app = make_app(state)
        heap.freeze()
        config = uvicorn.Config(
            app,
            host=host,
            port=sock.getsockname()[1],
            ssl_certfile=ssl_certfile,
            ssl_keyfile=ssl_keyfile,
            log_level=log_level,
            access_log=_logs_access(log_level),
            timeout_graceful_shutdown=5,
            **uvicorn_limits(state.settings),
        )
        server = uvicorn.Server(config)
        with contextlib.suppress(KeyboardInterrupt):  # as uvicorn.run: Ctrl-C is a clean stop
            server.run(sockets=[sock])
    finally:
        sock.close()
    if not server.started:  # the app's startup failed (logged by uvicorn): uvicorn.run's exit status
        raise SystemExit(STARTUP_FAILURE)
