"""The admin API (separate admin key): traffic split, hot-loading a checkpoint, promote and roll back.

``POST /admin/split {"weights": {"a": 0.9, "b": 0.1}}``, ``POST /admin/load {"arm": "b", "path": ...}``
(loads without restart; the arm joins with weight ``weight``, default 0), ``POST /admin/promote
{"arm": "b"}`` (all traffic to b), ``POST /admin/rollback`` (undo the last change), ``GET /admin/arms``.
"""

from __future__ import annotations

import asyncio
import json

from fastapi import FastAPI, Request

from tandem.errors import TandemError
from tandem.serve.app import ServerState, check_admin_key
from tandem.serve.protocol import ApiError


async def _body(request: Request) -> dict:
    try:
        data = json.loads(await request.body() or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ApiError(400, f"body is not valid JSON: {err}", code="json_invalid") from err
    if not isinstance(data, dict):
        raise ApiError(400, "body must be a JSON object", code="invalid_body")
    return data


def _field(data: dict, key: str, kind: type, required: bool = True):
    value = data.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ApiError(400, f"field '{key}' must be a {kind.__name__}", param=key)
    return value


def _arms(state: ServerState) -> dict:
    return {
        "split": state.router.split,
        "arms": {
            n: {"path": str(a.model.folder), "version": a.model.version, "format": a.model.format}
            for n, a in state.router.arms.items()
        },
    }


def register_admin(app: FastAPI, state: ServerState) -> None:
    """Attach the /admin routes."""

    @app.get("/admin/arms")
    async def arms(request: Request):
        check_admin_key(state, request)
        return _arms(state)

    @app.post("/admin/split")
    async def split(request: Request):
        check_admin_key(state, request)
        weights = _field(await _body(request), "weights", dict)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in weights.values()):
            raise ApiError(400, "weights must be numbers", param="weights")
        try:
            state.router.set_split({k: float(v) for k, v in weights.items()})
        except (KeyError, ValueError) as err:
            raise ApiError(400, str(err).strip("\"'"), param="weights") from err
        return _arms(state)

    @app.post("/admin/load")
    async def load(request: Request):
        check_admin_key(state, request)
        data = await _body(request)
        name, path = _field(data, "arm", str), _field(data, "path", str)
        weight = _field(data, "weight", (int, float), required=False)
        from tandem.serve.server import build_arm

        try:
            arm = await asyncio.get_running_loop().run_in_executor(None, build_arm, state, name, path)
        except TandemError as err:
            raise ApiError(400, str(err), param="path", code="model_load_failed") from err
        arm.batcher.start()
        state.batchers.append(arm.batcher)
        state.router.add(arm, None if weight is None else float(weight))
        return _arms(state)

    @app.post("/admin/promote")
    async def promote(request: Request):
        check_admin_key(state, request)
        name = _field(await _body(request), "arm", str)
        if name not in state.router.arms:
            raise ApiError(404, f"unknown arm '{name}'", param="arm", code="arm_not_found")
        state.router.promote(name)
        return _arms(state)

    @app.post("/admin/rollback")
    async def rollback(request: Request):
        check_admin_key(state, request)
        try:
            state.router.rollback()
        except IndexError as err:
            raise ApiError(400, str(err), code="nothing_to_roll_back") from err
        return _arms(state)
