"""Deterministic, resumable prompt batches: each epoch is a fresh shuffle seeded with ``seed + epoch``.

The whole state is ``(epoch, position)``: the permutation of an epoch is recomputed from the seed, so a
checkpoint stores two integers and a resumed run draws exactly the batches an uninterrupted run would.
Batches always hold ``batch_size`` rows: a batch that reaches the end of an epoch continues with the
start of the next epoch's shuffle (every row is seen once per epoch).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from tandem.data.prompts import PromptDataset
from tandem.errors import ConfigError, DataError


class PromptSampler:
    """Draws batches of rows from a PromptDataset in a seeded order that reshuffles every epoch."""

    def __init__(self, dataset: PromptDataset, batch_size: int, seed: int) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch size must be a positive integer, got {batch_size!r}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = int(seed)
        self.epoch = 0
        self.position = 0  # index into the current epoch's permutation
        self._order: list[int] | None = None  # permutation of self.epoch, computed on demand

    def epoch_order(self, epoch: int) -> list[int]:
        """Row indices in the order epoch ``epoch`` visits them (``randperm`` seeded with seed + epoch)."""
        gen = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(len(self.dataset), generator=gen).tolist()

    def next_indices(self, count: int | None = None) -> list[int]:
        """Indices of the next batch (``count`` rows, default the batch size), advancing the position (and
        the epoch when one ends)."""
        want = self.batch_size if count is None else count
        out: list[int] = []
        while len(out) < want:
            if self._order is None:
                self._order = self.epoch_order(self.epoch)
            take = self._order[self.position : self.position + want - len(out)]
            out.extend(take)
            self.position += len(take)
            if self.position == len(self._order):
                self.epoch, self.position, self._order = self.epoch + 1, 0, None
        return out

    def next_batch(self) -> list[dict[str, Any]]:
        """Rows of the next batch."""
        return [self.dataset.rows[i] for i in self.next_indices()]

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        """Endless stream of batches."""
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, int]:
        """What a checkpoint stores to resume at this exact data position."""
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "num_rows": len(self.dataset),
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume from :meth:`state_dict`; DataError when the dataset size changed, ConfigError when the
        seed did (either would silently change which prompts come next)."""
        missing = sorted({"epoch", "position", "seed", "num_rows"} - set(state))
        if missing:
            raise DataError(f"sampler state lacks {', '.join(missing)}")
        if int(state["num_rows"]) != len(self.dataset):
            raise DataError(
                f"checkpoint data position is for {state['num_rows']} rows, this dataset has {len(self.dataset)}",
                where=self.dataset.source,
            )
        if int(state["seed"]) != self.seed:
            raise ConfigError(
                f"checkpoint data seed {state['seed']} differs from this run's seed {self.seed}"
            )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position < len(self.dataset):
            raise DataError(f"sampler state out of range (epoch {epoch}, position {position})")
        self.epoch, self.position, self._order = epoch, position, None
