"""Build a server state from model folders and run it under uvicorn.

Without API keys the server refuses any bind address but loopback (an open model endpoint on a public
interface is a mistake we do not let through). Only this package imports uvicorn.
"""

from __future__ import annotations

import json
import logging
import os
from contextlib import asynccontextmanager
from pathlib import Path

from tandem.errors import ConfigError, MissingDependencyError
from tandem.serve.batcher import DynamicBatcher
from tandem.serve.cache import LRUCache
from tandem.serve.model import ServedModel
from tandem.serve.router import Arm
from tandem.utils.net import is_loopback_host

logger = logging.getLogger(__name__)


def build_arm(state, name: str, path: str | Path) -> Arm:
    """Load ``path`` and wrap it in an arm with its own batcher and cache (batcher not started)."""
    model = ServedModel.load(path, name=state.name)
    s = state.settings
    batcher = DynamicBatcher(
        model.run,
        max_batch_size=s.max_batch_size,
        max_wait_ms=s.max_wait_ms,
        max_queue=s.max_queue,
        metrics=state.metrics,
        arm=name,
    )
    return Arm(name, model, batcher, LRUCache(s.cache_size))


def build_state(
    arms: dict[str, str], settings, name: str | None = None, split: dict[str, float] | None = None
):
    """A :class:`~tandem.serve.app.ServerState` with ``arms`` (name -> model/run folder) loaded."""
    from tandem.serve.app import ServerState

    first = next(iter(arms.values()))
    state = ServerState(settings, name or Path(first).resolve().name)
    for arm_name, path in arms.items():
        state.router.add(build_arm(state, arm_name, path))
    if split:
        state.router.set_split(split, record=False)
    state.router._history.clear()
    if settings.feedback_db:
        from tandem.serve.feedback import FeedbackStore

        state.feedback = FeedbackStore(settings.feedback_db)
    return state


def make_app(state):
    """The FastAPI app with a lifespan that starts the batchers and marks the server ready."""
    from tandem.serve.app import create_app

    app = create_app(state)

    @asynccontextmanager
    async def lifespan(_app):
        for arm in state.router.arms.values():
            arm.batcher.start()
            state.batchers.append(arm.batcher)
        state.ready = True
        try:
            yield
        finally:
            state.ready = False
            for batcher in state.batchers:
                await batcher.stop()

    app.router.lifespan_context = lifespan
    return app


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


SPEC_ENV = "TANDEM_SERVE_SPEC"


def app_from_env():
    """App factory for uvicorn worker processes (``--workers N``): rebuilds the state from the JSON spec
    the parent put in ``TANDEM_SERVE_SPEC`` (arms, settings, name, split). Each worker loads its own copy
    of the model and runs its own batcher; the workers share the listening socket."""
    import dataclasses

    from tandem.serve.app import ServeSettings

    spec = json.loads(os.environ[SPEC_ENV])
    fields = {f.name for f in dataclasses.fields(ServeSettings)}
    settings = ServeSettings(**{k: v for k, v in spec["settings"].items() if k in fields})
    return make_app(build_state(spec["arms"], settings, name=spec["name"], split=spec["split"]))


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
) -> None:
    """Serve with ``workers`` uvicorn worker processes behind one port (replicas)."""
    import dataclasses

    check_bind(host, bool(settings.api_keys))
    try:
        import uvicorn
    except ImportError as err:
        raise MissingDependencyError("uvicorn", "serve") from err
    spec = {"arms": arms, "settings": dataclasses.asdict(settings), "name": name, "split": split}
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
        timeout_graceful_shutdown=5,
    )


def run_server(
    state,
    host: str,
    port: int,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
    log_level: str = "warning",
) -> None:
    """Serve ``state`` with uvicorn until interrupted."""
    check_bind(host, bool(state.settings.api_keys))
    try:
        import uvicorn
    except ImportError as err:
        raise MissingDependencyError("uvicorn", "serve") from err
    app = make_app(state)
    uvicorn.run(
        app,
        host=host,
        port=port,
        ssl_certfile=ssl_certfile,
        ssl_keyfile=ssl_keyfile,
        log_level=log_level,
        timeout_graceful_shutdown=5,
    )
