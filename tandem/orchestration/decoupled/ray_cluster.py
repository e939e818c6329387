"""Lifecycle of the Ray instance of one run: join a cluster, or start (and fully remove) a local one.

* ``architecture.ray.address`` set: ``ray.init(address=...)`` joins the existing cluster; at the end the
  driver only disconnects (``ray.shutdown()`` of a joined cluster never stops it).
* no address: a private local instance — its own temp folder (``tempfile``, short because Ray puts unix
  sockets in it), no dashboard, ``architecture.ray.num_cpus`` CPUs, worker logs not streamed to the
  driver. Token authentication is on, with the token in that folder rather than Ray's default
  ``~/.ray/auth_token``. At the end ``ray.shutdown()`` stops every process of the instance and the folder
  is deleted, so a run leaves no processes and no files behind.
* Ray already initialised in this process (a notebook, a test fixture): that connection is used and left
  as it was.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

from tandem.channels.ray import import_ray
from tandem.config.schema import TandemConfig
from tandem.errors import ConfigError

log = logging.getLogger(__name__)

_AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def _reset_token_cache() -> None:
    """Ray caches the auth mode and token per process; a new local instance brings a new token, and after
    it the process returns to the mode of its environment. (Ray < 2.52 has no token auth: nothing to do.)"""
    with contextlib.suppress(ImportError, AttributeError):
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a ``host:port`` nobody listens on (``ray.init`` would retry for minutes).
    ``auto`` and ``ray://`` addresses are left to Ray."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ConfigError(
            f"cannot reach the Ray cluster at {address} ({exc.strerror or type(exc).__name__})",
            where="architecture.ray.address",
            hint="start it with `ray start --head`, fix the address, or set null for a local instance",
        ) from None


class RayCluster:
    """Connect on construction (see the module docstring); :meth:`close` undoes exactly what it did."""

    def __init__(self, cfg: TandemConfig) -> None:
        ray = import_ray()
        rc = cfg.architecture.ray
        self.namespace = rc.namespace or f"tandem-{cfg.run.name}"
        self.temp_dir: Path | None = None
        self._env: dict[str, str | None] = {}
        self.joined = rc.address is not None
        self.reused = ray.is_initialized()
        if self.reused:
            log.info("using the Ray instance this process is already connected to")
            return
        if self.joined:
            check_reachable(rc.address)
            _reset_token_cache()
            ray.init(address=rc.address, namespace=self.namespace, log_to_driver=False)
            log.info("joined the Ray cluster at %s (namespace %s)", rc.address, self.namespace)
            return
        self.temp_dir = Path(tempfile.mkdtemp(prefix="tandem-ray-"))
        try:
            self._set_local_token()
            ray.init(
                address="local",  # a new instance even if RAY_ADDRESS is set
                num_cpus=rc.num_cpus,
                namespace=self.namespace,
                include_dashboard=False,
                log_to_driver=False,
                _temp_dir=str(self.temp_dir),
            )
        except BaseException:
            self.close()
            raise
        log.info("started a local Ray instance in %s", self.temp_dir)

    def _set_local_token(self) -> None:
        """Token auth for the local instance (Ray's default) with a fresh token in its temp folder, unless
        the user chose a mode or a token. ``close`` restores the environment."""
        if any(os.environ.get(k) is not None for k in _AUTH_ENV):
            return
        assert self.temp_dir is not None
        token = self.temp_dir / "auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        self._env = {k: os.environ.get(k) for k in _AUTH_ENV}
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(token)  # ray.init turns RAY_AUTH_MODE=token on itself
        _reset_token_cache()

    def close(self) -> None:
        """Disconnect (joined), or stop the local instance and delete its folder; idempotent."""
        if self.reused:
            return
        ray = import_ray()
        try:
            if ray.is_initialized():
                ray.shutdown()
        finally:
            for key, value in self._env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            if self._env:
                self._env = {}
                _reset_token_cache()
            if self.temp_dir is not None:
                shutil.rmtree(self.temp_dir, ignore_errors=True)
                self.temp_dir = None

    def __enter__(self) -> RayCluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
