"""Serving (layer L3): an OpenAI-compatible HTTP server with dynamic batching, caching and A/B arms.

Importing ``tandem.serve`` is cheap; fastapi/uvicorn are imported by :func:`require_serve_deps` callers
(``tandem serve``) and fail with a message naming the ``serve`` extra when missing.
"""

from __future__ import annotations

from tandem.errors import MissingDependencyError


def require_serve_deps() -> None:
    """Raise MissingDependencyError naming the ``serve`` extra unless fastapi and uvicorn import."""
    for package in ("fastapi", "uvicorn"):
        try:
            __import__(package)
        except ImportError as err:
            raise MissingDependencyError(package, "serve") from err


__all__ = ["require_serve_deps"]
