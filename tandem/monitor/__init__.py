"""Monitoring: metrics to JSONL, TensorBoard and a progress bar; phase timing; tables for the CLI."""

from tandem.monitor.metrics import MetricsLogger, read_metrics, read_samples
from tandem.monitor.summary import format_table
from tandem.monitor.timing import PhaseTimer

__all__ = ["MetricsLogger", "PhaseTimer", "format_table", "read_metrics", "read_samples"]
