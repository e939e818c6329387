"""``run``: the run's identity and output folder."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from tandem.config.base import Section
from tandem.utils.modules import is_file_spec


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
    plugins: list[str] = Field(
        default_factory=list,
        description="Your Python modules (my_algos, or a file: ./my_algos.py) imported before the config is "
        "checked, so the estimators, losses, engines, curricula and trackers they register can be named here "
        "(algorithm.advantage: my_adv). Rollout workers and learner ranks import them too. A file is "
        "recorded by its absolute path. Imported and run: trusted code only.",
    )

    @field_validator("plugins")
    @classmethod
    def _absolute_files(cls, value: list[str]) -> list[str]:
        """A plug-in file by its absolute path: the run folder's config.yaml loads from anywhere."""
        return [str(Path(p).expanduser().resolve()) if is_file_spec(p) else p for p in value]
