"""Architecture planner: a per-phase cost model, a discrete-event simulator of the colocated and decoupled
architectures (on devices of their own or sharing a pool of cores), calibration from a run's timing
metrics, and candidate layouts with a recommendation (``tandem plan``; see docs/planning.md). Pure Python:
no torch, no numpy."""

from tandem.plan.cost import Efficiency, LengthDist, ModelShape, PhaseTimes, Workload
from tandem.plan.devices import DEVICES, Device, get_device
from tandem.plan.sharing import CorePool
from tandem.plan.simulate import Layout, SimResult, simulate

__all__ = [
    "DEVICES",
    "CorePool",
    "Device",
    "Efficiency",
    "Layout",
    "LengthDist",
    "ModelShape",
    "PhaseTimes",
    "SimResult",
    "Workload",
    "get_device",
    "simulate",
]
