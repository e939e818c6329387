"""Run reports (layer L3): a self-contained HTML page with matplotlib plots of one run or two side by side.

Reads only files of the run folder (``metrics.jsonl``, ``samples.jsonl``, ``alerts.jsonl``,
``config.yaml``, ``summary.json``); never imports training or orchestration.
"""

from tandem.report.build import build_report, load_run

__all__ = ["build_report", "load_run"]
