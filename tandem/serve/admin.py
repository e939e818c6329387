"""The admin API (separate admin key): traffic split, hot-loading a checkpoint, promote and roll back.

``POST /admin/split {"weights": {"a": 0.9, "b": 0.1}}``, ``POST /admin/load {"arm": "b", "path": ...}``
(loads without restart; the arm joins with weight ``weight``, default 0), ``POST /admin/promote
{"arm": "b"}`` (all traffic to b), ``POST /admin/rollback`` (undo the last change), ``GET /admin/arms``.

Every change is made to the shared admin state (:mod:`tandem.serve.admin_state`) and this replica then
catches up with it (:func:`sync`); the other replicas catch up before their next request, loading a
hot-loaded checkpoint in the background first.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from pathlib import Path

from fastapi import FastAPI, Request

from tandem.errors import TandemError, first_line
from tandem.serve import admin_state as ops
from tandem.serve import heap
from tandem.serve.app import check_admin_key, parse_json_object
from tandem.serve.protocol import ApiError
from tandem.serve.router import build_arm
from tandem.serve.state import ServerState

logger = logging.getLogger(__name__)


def sync(state: ServerState) -> None:
    """Show the shared admin state's current table in this replica's router. Cheap when nothing changed
    (a version compare; a stat for the file store). Arms this replica has not loaded yet are loaded in
    the background; until they are, the replica keeps serving the table it has."""
    if state.store is None:
        return
    try:
        if state.store.version() == state.applied:
            return
        cfg = state.store.read()
    except (OSError, ValueError, KeyError) as err:
        logger.error("cannot read the shared admin state: %s", first_line(err))
        return
    missing = {load for load in cfg.current.arms.values() if load not in state.loaded}
    if missing:
        for load in missing - state.loading - set(state.failed):
            state.loading.add(load)
            asyncio.get_running_loop().create_task(_load_in_background(state, load, cfg.paths[load]))
        return
    state.router.show(cfg.current, state.loaded)
    state.applied = cfg.version


async def _load_in_background(state: ServerState, load: str, path: str) -> None:
    name = next((n for n, lid in state.store.read().current.arms.items() if lid == load), load)
    try:
        arm = await asyncio.get_running_loop().run_in_executor(None, build_arm, state, name, path)
    except Exception as err:  # keep serving the table we have; /admin/arms reports it
        state.failed[load] = first_line(err)
        logger.error("replica cannot load %s for arm %s: %s", path, name, first_line(err))
        return
    finally:
        state.loading.discard(load)
    _register(state, load, arm)
    sync(state)


def _register(state: ServerState, load: str, arm) -> None:
    arm.batcher.start()
    state.batchers.append(arm.batcher)
    state.loaded[load] = arm
    heap.refreeze()  # the new arm's model joins the frozen start-up heap (tandem.serve.heap)


def _change(state: ServerState, change: ops.Change) -> dict:
    """Apply ``change`` to the shared state (400 on invalid weights), catch up, describe the result."""
    try:
        state.store.update(change)
    except ops.SplitError as err:
        raise ApiError(400, str(err), param="weights") from err
    sync(state)
    return _arms(state)


def _field(data: dict, key: str, kind: type | tuple[type, ...], required: bool = True):
    """``data[key]`` if it is a ``kind`` (a bool is not a number), else a 400 naming the field."""
    value = data.get(key)
    if value is None and not required:
        return None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds:
        shown = "number" if float in kinds else {str: "string"}.get(kinds[0], kinds[0].__name__)
        raise ApiError(400, f"field '{key}' must be a {shown}", param=key)
    return value


def _arms(state: ServerState) -> dict:
    """What this replica (pid) serves, the shared state's version it shows, and loads it still waits
    for (``pending``: being loaded, or failed here); per arm, its engine replicas and scaling events."""
    body = {
        "split": state.router.split,
        "version": state.applied,
        "replica": os.getpid(),
        "engine": state.settings.engine,
        "arms": {
            n: {
                "path": str(a.model.folder),
                "version": a.model.version,
                "format": a.model.format,
                "engine_replicas": a.batcher.pool.status(),
            }
            for n, a in state.router.arms.items()
        },
    }
    if state.loading or state.failed:
        body["pending"] = {"loading": sorted(state.loading), "failed": dict(state.failed)}
    return body


def register_admin(app: FastAPI, state: ServerState) -> None:
    """Attach the /admin routes (each checks the admin key before reading the body)."""

    async def body(request: Request) -> dict:
        check_admin_key(state, request)
        return parse_json_object(await request.body() or b"{}")

    @app.get("/admin/arms")
    async def arms(request: Request):
        check_admin_key(state, request)
        return _arms(state)

    @app.post("/admin/split")
    async def split(request: Request):
        weights = _field(await body(request), "weights", dict)
        return _change(state, lambda cfg: ops.set_split(cfg, weights))

    @app.post("/admin/load")
    async def load(request: Request):
        data = await body(request)
        name, path = _field(data, "arm", str), _field(data, "path", str)
        weight = _field(data, "weight", (int, float), required=False)
        if not name:
            raise ApiError(400, "field 'arm' must be a non-empty string", param="arm")
        if weight is not None:
            try:
                weight = ops.check_weight(name, weight)
            except ops.SplitError as err:
                raise ApiError(400, str(err), param="weight") from err
        try:
            arm = await asyncio.get_running_loop().run_in_executor(None, build_arm, state, name, path)
        except TandemError as err:
            raise ApiError(400, str(err), param="path", code="model_load_failed") from err
        load_id = f"load-{uuid.uuid4().hex[:12]}"
        _register(state, load_id, arm)
        absolute = str(Path(path).resolve())  # the other replicas may resolve relative paths elsewhere
        return _change(state, lambda cfg: ops.add_arm(cfg, name, load_id, absolute, weight))

    @app.post("/admin/promote")
    async def promote(request: Request):
        name = _field(await body(request), "arm", str)
        try:
            return _change(state, lambda cfg: ops.promote(cfg, name))
        except KeyError as err:
            raise ApiError(404, f"unknown arm '{name}'", param="arm", code="arm_not_found") from err

    @app.post("/admin/rollback")
    async def rollback(request: Request):
        check_admin_key(state, request)
        try:
            return _change(state, ops.rollback)
        except IndexError as err:
            raise ApiError(400, str(err), code="nothing_to_roll_back") from err
