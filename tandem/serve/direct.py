"""Direct dispatch of the generation routes, past FastAPI's router.

``POST /v1/completions`` and ``POST /v1/chat/completions`` take a request body the routes parse and
validate themselves (:func:`tandem.serve.routes._parse`), so FastAPI's per-request work for them, its
exception and exit-stack middleware, route matching, and dependency solving (which parses the query
string), is pure overhead: about a quarter of the event loop's CPU per request. :class:`Direct` sits
inside ``Gate`` and ``BodyLimit`` (keys, metrics and body limits apply as before), calls the same
endpoint function the FastAPI route is registered with, and answers the errors the endpoints raise with
the same handlers (:data:`tandem.serve.app.ERROR_HANDLERS`). Anything else (another path or method, a
bug, which ``Gate`` answers with a 500) goes on as before.

:class:`Front` is what uvicorn runs: it sends those POSTs to their own ``Gate`` → ``BodyLimit`` →
:class:`Direct` chain before FastAPI and Starlette's outer layers (the app call, ``ServerErrorMiddleware``
and its wrapped ``send``), which do nothing for them: ``Gate`` answers every bug with a 500 itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request

from tandem.serve.app import error_handler

Endpoint = Callable[[Request], Awaitable[object]]


class Direct:
    """ASGI middleware: ``POST`` to a path in ``endpoints`` runs that endpoint directly."""

    def __init__(self, app, endpoints: dict[str, Endpoint]) -> None:
        self.app, self.endpoints = app, endpoints

    async def __call__(self, scope, receive, send) -> None:
        endpoint = self.endpoints.get(scope["path"]) if scope["type"] == "http" else None
        if endpoint is None or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        request = Request(scope, receive, send)
        try:
            response = await endpoint(request)
        except Exception as exc:
            handler = error_handler(exc)
            if handler is None:
                raise
            response = await handler(request, exc)
        await response(scope, receive, send)


class Front:
    """The server's outermost ASGI app: ``POST`` to a path in ``paths`` goes to ``direct`` (the
    middleware chain ending in :class:`Direct`); everything else, lifespan included, to ``app``. Any
    other attribute is the FastAPI app's (``routes``, ``state``, ``openapi()``)."""

    def __init__(self, app, direct, paths: set[str]) -> None:
        self.app, self.direct, self.paths = app, direct, frozenset(paths)

    def __getattr__(self, name: str):
        if "app" not in self.__dict__:  # not built yet
            raise AttributeError(name)
        return getattr(self.__dict__["app"], name)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in self.paths:
            scope["app"] = self.app  # as Starlette sets it, for anything that reads request.app
            return await self.direct(scope, receive, send)
        return await self.app(scope, receive, send)
