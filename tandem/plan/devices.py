"""Device figures the cost model reads: peak dense FLOP/s, memory bandwidth and size, interconnect.

Figures are vendor peaks for dense bf16 (fp32 for a CPU core) without sparsity; the cost model multiplies
them by efficiencies (:class:`~tandem.plan.cost.Efficiency`), never uses them raw. A new device is one
line in :data:`DEVICES`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.errors import ConfigError


@dataclass(frozen=True)
class Device:
    """One accelerator (or one CPU core) as the planner sees it."""

    name: str
    flops: float  # peak dense FLOP/s (bf16; fp32 for cpu-core)
    mem_bw: float  # memory bandwidth, bytes/s
    mem_bytes: float  # memory capacity, bytes
    link_bw: float  # intra-node interconnect per device (NVLink; shared memory for a CPU), bytes/s
    net_bw: float  # inter-node network per device (InfiniBand / RoCE NIC share), bytes/s
    per_node: int = 8  # devices per node


GB = 1e9

DEVICES: dict[str, Device] = {
    # One core of a current x86 server: 2 AVX-512 FMA units ≈ 100 GFLOP/s fp32 peak; a core's share of
    # DRAM bandwidth; shared-memory copies between processes.
    "cpu-core": Device("cpu-core", 1.0e11, 10 * GB, 16 * GB, 5 * GB, 1.25 * GB, per_node=2),
    "a100": Device("a100", 312e12, 2039 * GB, 80 * GB, 300 * GB, 25 * GB),
    "h100": Device("h100", 989e12, 3350 * GB, 80 * GB, 450 * GB, 50 * GB),
    "h200": Device("h200", 989e12, 4800 * GB, 141 * GB, 450 * GB, 50 * GB),
    "b200": Device("b200", 2250e12, 8000 * GB, 180 * GB, 900 * GB, 50 * GB),
}


def get_device(name: str, *, where: str = "--gpu") -> Device:
    """The table entry for ``name`` (case-insensitive); one-line error listing the known names."""
    dev = DEVICES.get(name.lower())
    if dev is None:
        raise ConfigError(f"unknown device {name!r}; known: {', '.join(DEVICES)}", where=where)
    return dev
