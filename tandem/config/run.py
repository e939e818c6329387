"""``run``: the run's identity and output folder."""

from __future__ import annotations

from pydantic import Field

from tandem.config.base import Section


class RunConfig(Section):
    name: str = Field(
        "run", description="Run name; the run folder is <output_dir> (or runs/<name> if unset)."
    )
    output_dir: str | None = Field(None, description="Folder for metrics, samples, checkpoints and config.")
    seed: int = Field(0, description="Seed for data order, sampling and initialisation.")
    overwrite: bool = Field(
        False,
        description="Replace a run folder that already holds a Tandem run (config.yaml and metrics.jsonl); "
        "a non-empty folder that is not a run folder is never deleted.",
    )
