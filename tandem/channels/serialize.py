"""Explicit wire format of a :class:`~tandem.channels.base.TrajectoryMessage`: safetensors bytes.

Tensors travel as safetensors (an optional one, such as per-turn rewards, only when set) (raw little-endian arrays with a JSON header — no pickle, so a message from
an untrusted producer cannot execute code); list fields (prompts, completions, finish reasons, sample ids,
extras) and the message header travel as JSON in the safetensors metadata. Round trip is exact.
"""

from __future__ import annotations

import json

from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from tandem.channels.base import TrajectoryMessage
from tandem.errors import DataError
from tandem.types import OPTIONAL_ROLLOUT_TENSORS, ROLLOUT_TENSORS, RolloutBatch

FORMAT = "tandem.trajectory/1"
_LISTS = ("prompts", "completions", "finish_reasons", "sample_ids", "extras")


def encode_message(msg: TrajectoryMessage) -> bytes:
    """Serialise a message to bytes (tensors as safetensors, the rest as JSON metadata)."""
    b = msg.batch
    # clone: fields may share storage (e.g. one mask tensor used twice), which safetensors refuses
    tensors = {name: getattr(b, name).detach().clone().contiguous() for name in ROLLOUT_TENSORS}
    for name in OPTIONAL_ROLLOUT_TENSORS:  # sent only when set; absent decodes as None
        if getattr(b, name) is not None:
            tensors[name] = getattr(b, name).detach().clone().contiguous()
    tensors["scores"] = msg.scores.detach().float().clone().contiguous()
    header = {
        "format": FORMAT,
        "ticket": msg.ticket,
        "worker_id": msg.worker_id,
        "meta": msg.meta,
        "curriculum": msg.curriculum,
        **{name: getattr(b, name) for name in _LISTS},
    }
    return st_save(tensors, metadata={"tandem": json.dumps(header)})


def decode_message(data: bytes) -> TrajectoryMessage:
    """Inverse of :func:`encode_message`; DataError on bytes that are not a Tandem trajectory message."""
    try:
        tensors = st_load(data)
        header = json.loads(_metadata(data)["tandem"])
    except Exception as exc:  # safetensors raises several types for corrupt input
        raise DataError(f"corrupt trajectory message ({type(exc).__name__}: {exc})") from exc
    if header.get("format") != FORMAT:
        raise DataError(f"unknown trajectory message format {header.get('format')!r}, expected {FORMAT}")
    batch = RolloutBatch(
        **{name: tensors[name] for name in ROLLOUT_TENSORS},
        **{name: list(header[name]) for name in _LISTS},
        **{name: tensors.get(name) for name in OPTIONAL_ROLLOUT_TENSORS},
    )
    return TrajectoryMessage(
        batch=batch,
        scores=tensors["scores"],
        ticket=int(header["ticket"]),
        worker_id=int(header["worker_id"]),
        meta={k: float(v) for k, v in header["meta"].items()},
        curriculum=header.get("curriculum"),
    )


def _metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` of safetensors bytes (8-byte little-endian header length, then JSON)."""
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + n].decode("utf-8")).get("__metadata__", {})
