"""``checkpoint``: how often to save, how many to keep, the best model, and an optional object-storage copy."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from tandem.config.base import Section


class CheckpointConfig(Section):
    every: int = Field(0, ge=0, description="Save a checkpoint every N steps (0 = only at the end).")
    keep_last: int = Field(2, ge=1, description="Keep the last K checkpoints.")
    save_final: bool = Field(True, description="Save a checkpoint at the end.")
    best_metric: str | None = Field(
        None,
        description="Also keep the best model by this held-out metric (e.g. eval/accuracy) in <run>/best/: "
        "weights and tokenizer (a Hugging Face folder for export, serve or model.path) and best.json (step, "
        "value), replaced atomically whenever an evaluation, the step-0 one included, beats it.",
    )
    best_mode: Literal["max", "min"] = Field("max", description="Whether a larger best_metric is better.")
    remote_dir: str | None = Field(
        None,
        description="Also copy every checkpoint (marker last), metrics.jsonl and config.yaml to "
        "<remote_dir>/<run.name>/ — any fsspec URL (s3://, gs://, …); --resume fetches the newest complete "
        "one from there when the run folder has none as new.",
    )

    @field_validator("best_metric")
    @classmethod
    def _eval_metric(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("eval/"):
            raise ValueError(
                f"'{value}' is not a held-out metric; the best model is chosen on an eval/ metric "
                "(e.g. eval/accuracy), not on training metrics"
            )
        return value

    @field_validator("remote_dir")
    @classmethod
    def _remote_url(cls, value: str | None) -> str | None:
        if value is not None and ("://" not in value or value.startswith("file://")):
            raise ValueError(
                f"'{value}' is not an object-storage URL (e.g. s3://bucket/runs); for a local or mounted "
                "folder set run.output_dir instead"
            )
        return value
