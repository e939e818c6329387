"""Network address helpers shared by the server (bind checks) and the load tester (target checks)."""

from __future__ import annotations

import ipaddress


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a name or an IP literal) stays on this machine: ``localhost`` or a loopback IP."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
