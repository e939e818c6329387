"""``checkpoint``: how often to save, how many to keep, and an optional object-storage copy."""

from __future__ import annotations

from pydantic import Field, field_validator

from tandem.config.base import Section


class CheckpointConfig(Section):
    every: int = Field(0, ge=0, description="Save a checkpoint every N steps (0 = only at the end).")
    keep_last: int = Field(2, ge=1, description="Keep the last K checkpoints.")
    save_final: bool = Field(True, description="Save a checkpoint at the end.")
    remote_dir: str | None = Field(
        None,
        description="Also copy every checkpoint (marker last), metrics.jsonl and config.yaml to "
        "<remote_dir>/<run.name>/ — any fsspec URL (s3://, gs://, …); --resume fetches the newest complete "
        "one from there when the run folder has none as new.",
    )

    @field_validator("remote_dir")
    @classmethod
    def _remote_url(cls, value: str | None) -> str | None:
        if value is not None and ("://" not in value or value.startswith("file://")):
            raise ValueError(
                f"'{value}' is not an object-storage URL (e.g. s3://bucket/runs); for a local or mounted "
                "folder set run.output_dir instead"
            )
        return value
