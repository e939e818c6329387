"""Micro-benchmark: weights through the Ray object store as numpy arrays vs as pickled torch tensors.

A ~50 MB fp32 state dict (12 matrices of 1024×1024 plus small vectors, like a small model's) goes from
the driver to a worker actor, the way the learner publishes and a rollout worker fetches:

* ``numpy``: Tandem's :class:`~tandem.channels.ray_weights.RayObjectStoreWeights` — ``ray.put`` of
  ``{name: ndarray}`` + version registry; the worker maps the arrays zero-copy and copies once into
  private tensors (``torch.from_numpy(...)`` of a copy).
* ``torch``: the naive ``ray.put(state_dict)``; the worker's ``ray.get`` unpickles torch tensors.

Each round times publish (driver) and fetch (actor) separately; rounds alternate between the two methods
and the median is reported, with the ratio torch / numpy. Runs on a private local Ray instance that is
removed at the end.

    .venv/bin/python bench/ray_weights.py [--rounds 7] [--mb 50]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tandem.channels.ray_weights import RayObjectStoreWeights
from tandem.config import build_config
from tandem.orchestration.decoupled.ray_cluster import RayCluster


def make_state(mb: int) -> dict[str, torch.Tensor]:
    n = max(1, mb * 2**20 // (4 * 1024 * 1024))
    g = torch.Generator().manual_seed(0)
    state = {f"layers.{i}.weight": torch.randn(1024, 1024, generator=g) for i in range(n)}
    state.update({f"layers.{i}.bias": torch.randn(1024, generator=g) for i in range(n)})
    return state


class Reader:
    """A worker-like actor: fetch the newest weights into private tensors; returns seconds and a checksum."""

    def fetch_numpy(self, weights: RayObjectStoreWeights, known: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        state, _ = weights.fetch(known)
        elapsed = time.perf_counter() - t0
        return elapsed, float(sum(float(t[0].sum()) for t in state.values()))

    def fetch_torch(self, refs: list) -> tuple[float, float]:
        import ray

        t0 = time.perf_counter()
        state = ray.get(refs[0])
        elapsed = time.perf_counter() - t0
        return elapsed, float(sum(float(t[0].sum()) for t in state.values()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--mb", type=int, default=50)
    args = ap.parse_args()
    torch.set_num_threads(1)
    state = make_state(args.mb)
    size_mb = sum(t.numel() * t.element_size() for t in state.values()) / 2**20
    cfg = build_config(
        {"model": {"path": "unused"}, "data": {"task": "arith"}, "architecture": {"ray": {"num_cpus": 2}}}
    )
    with RayCluster(cfg):
        import ray

        reader = ray.remote(Reader).options(num_cpus=1).remote()
        weights = RayObjectStoreWeights()
        times: dict[str, dict[str, list[float]]] = {
            m: {"publish": [], "fetch": []} for m in ("numpy", "torch")
        }
        checks = []
        for r in range(args.rounds + 1):  # round 0 warms both paths up and is not counted
            t0 = time.perf_counter()
            weights.publish(state, r)
            pub = time.perf_counter() - t0
            fetch, check_np = ray.get(reader.fetch_numpy.remote(weights, r - 1))
            t0 = time.perf_counter()
            ref = ray.put(state)
            pub_t = time.perf_counter() - t0
            fetch_t, check_t = ray.get(reader.fetch_torch.remote([ref]))
            del ref
            checks.append(check_np == check_t)
            if r:
                times["numpy"]["publish"].append(pub)
                times["numpy"]["fetch"].append(fetch)
                times["torch"]["publish"].append(pub_t)
                times["torch"]["fetch"].append(fetch_t)
        weights.unlink()
    assert all(checks), "the two paths delivered different weights"
    med = {m: {k: statistics.median(v) for k, v in d.items()} for m, d in times.items()}
    print(
        f"state: {len(state)} tensors, {size_mb:.1f} MB fp32; median of {args.rounds} rounds, ray {ray.__version__}"
    )
    print(f"{'method':8} {'publish ms':>11} {'fetch ms':>10} {'total ms':>10} {'fetch MB/s':>11}")
    for m in ("numpy", "torch"):
        p, f = med[m]["publish"], med[m]["fetch"]
        print(f"{m:8} {p * 1e3:11.1f} {f * 1e3:10.1f} {(p + f) * 1e3:10.1f} {size_mb / f:11.0f}")
    for k in ("publish", "fetch"):
        print(f"ratio torch/numpy {k}: {med['torch'][k] / med['numpy'][k]:.1f}x")
    tot = {m: med[m]["publish"] + med[m]["fetch"] for m in med}
    print(f"ratio torch/numpy total: {tot['torch'] / tot['numpy']:.1f}x")


if __name__ == "__main__":
    main()
