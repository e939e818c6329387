"""summary.json records what a run's float results depend on besides config and code (library versions,
the CPU kernels torch dispatched, threads): the quickstart demo's 84.5% -> 82.5% came from a host change
(AVX-512 -> AVX2 kernels) with identical code, which nothing in the run folder showed."""

from __future__ import annotations

import json

import torch

from tandem.orchestration.runfolder import RunResult, finish_run, run_environment


def test_summary_records_the_environment(tmp_path):
    result = RunResult(run_dir=tmp_path, steps=3, last_metrics={"eval/accuracy": 0.5, "reward/mean": 0.25})
    finish_run(result, tmp_path / "checkpoints")
    summary = json.loads((tmp_path / "summary.json").read_text())
    env = summary["environment"]
    assert env["torch"] == torch.__version__
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert env["torch_threads"] == torch.get_num_threads()
    assert env["transformers"] and env["numpy"] and env["cpu"]
    assert summary["eval_after"] == {"eval/accuracy": 0.5}


def test_cpu_capability_is_the_dispatched_one(monkeypatch):
    """The record asks torch's dispatcher (ATEN_CPU_CAPABILITY can lower it below the host's), not cpuinfo."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert run_environment()["cpu_capability"] == "AVX512"
