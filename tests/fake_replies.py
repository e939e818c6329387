"""A fake engine's batch for unit tests of the code around engines: every row samples one fixed reply."""

from __future__ import annotations

import torch

from tandem.types import RolloutBatch


def reply_batch(tokenizer, contexts: list[list[int]], n: int, reply: str) -> RolloutBatch:
    """``n`` rows per context (left-padded prompt ids), each sampling ``reply``'s ids at log-prob -0.5."""
    rows = [c for c in contexts for _ in range(n)]
    resp = tokenizer(reply, add_special_tokens=False)["input_ids"]
    B, P, R = len(rows), max(map(len, rows)), len(resp)
    pid, pm = torch.zeros(B, P, dtype=torch.long), torch.zeros(B, P, dtype=torch.bool)
    for i, c in enumerate(rows):
        pid[i, P - len(c) :], pm[i, P - len(c) :] = torch.tensor(c), True
    rm = torch.ones(B, R, dtype=torch.bool)
    return RolloutBatch(
        pid, pm, torch.tensor([resp] * B), rm, rm.float() * -0.5,
        torch.arange(len(contexts)).repeat_interleave(n), torch.zeros(B, dtype=torch.long), [""] * B,
        [reply.rstrip("\n")] * B, ["stop"] * B, [str(i) for i in range(B)], [{} for _ in range(B)],
    )  # fmt: skip
