"""What every config section shares: strict pydantic settings, and the error a cross-field check raises."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    # allow_inf_nan=False: a float key set to .inf/.nan (e.g. trainer.lr=.inf) is an error naming the key.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class CrossFieldError(ValueError):
    """A cross-field check failed; ``key`` is the dotted key to blame."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key
