"""The run folder: what a run may write into, how it is created, and how it is finished.

The run folder holds ``config.yaml`` (resolved), ``metrics.jsonl``, ``samples.jsonl``, ``alerts.jsonl``,
``tensorboard/``, ``checkpoints/step-N/``, ``best/`` (with ``checkpoint.best_metric``) and — written
last, atomically — ``summary.json``. A folder without ``summary.json`` is an unfinished run (``--resume``
continues it). Both architectures use these functions; the step loop itself is
:mod:`tandem.orchestration.loop`.
"""

from __future__ import annotations

import logging
import platform
import shutil
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from tandem.config import config_changes, config_to_yaml
from tandem.config.schema import TandemConfig
from tandem.data.outputs import check_output_dir
from tandem.errors import ConfigError
from tandem.monitor.metrics import METRICS_FILE
from tandem.orchestration.remote import check_remote, fetch_newer_checkpoint
from tandem.train.checkpoint import latest_checkpoint, latest_step
from tandem.utils.io import atomic_write_json, atomic_write_text, discard_dir

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    """Where a run wrote, how many steps it took, its first and last evaluation and final metrics."""

    run_dir: Path
    steps: int
    eval_before: dict[str, float] = field(default_factory=dict)
    eval_after: dict[str, float] = field(default_factory=dict)
    last_metrics: dict[str, float] = field(default_factory=dict)
    best: dict[str, Any] = field(default_factory=dict)  # checkpoint.best_metric: the best model kept


def run_dir_of(cfg: TandemConfig) -> Path:
    return Path(cfg.run.output_dir) if cfg.run.output_dir else Path("runs") / cfg.run.name


def run_inputs(cfg: TandemConfig) -> tuple[str | None, ...]:
    """The folders and files a run reads (models, data): replacing the run folder must not delete them."""
    reward_model = cfg.reward.model.path if cfg.reward.model else None
    critic = cfg.critic.path if cfg.critic else None
    return (cfg.model.path, cfg.model.ref_path, critic, reward_model, cfg.data.train_file, cfg.data.eval_file)


def check_run_dir(cfg: TandemConfig, *, resume: bool) -> Path:
    """The run folder, after refusing what the run may not write into; writes nothing.

    A non-empty folder needs ``--resume`` or ``run.overwrite``; ``run.overwrite`` replaces only a Tandem
    run folder (``config.yaml`` + ``metrics.jsonl``, see :mod:`tandem.data.outputs`), never an unrelated
    folder nor one holding a model or data file the run reads (:func:`run_inputs`)."""
    run_dir = run_dir_of(cfg)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run folder {run_dir} is a file", where="run.output_dir")
    holds = run_dir.is_dir() and any(run_dir.iterdir())
    if holds and not (resume or cfg.run.overwrite):
        raise ConfigError(
            f"run folder {run_dir} already holds a run",
            where="run.output_dir",
            hint="pass --resume to continue it, run.overwrite=true, or another run.output_dir",
        )
    if resume:
        _check_resume_step(cfg, run_dir)
        _check_lora_base(cfg, run_dir)
    if holds and not resume:
        check_output_dir(
            run_dir,
            "run",
            sources=run_inputs(cfg),
            where="run.output_dir",
            hint="run.overwrite replaces only run folders; choose another run.output_dir",
        )
    return run_dir


def _latest_step(run_dir: Path) -> int | None:
    """The step of the run's latest complete checkpoint, None without one."""
    return latest_step(run_dir / "checkpoints")


def _check_resume_step(cfg: TandemConfig, run_dir: Path) -> None:
    """A resume continues from the latest checkpoint up to ``trainer.total_steps``: a checkpoint past it
    has nothing to train, and would end with a run that reports no evaluation; a run that finished there
    has nothing to add (resuming would only rewrite its summary). A run that logged steps but holds no
    complete checkpoint is refused rather than started over under its old metrics and ``best/`` (with
    ``checkpoint.remote_dir`` a newer copy may still come from there: :func:`prepare_run_dir` checks)."""
    step, total = _latest_step(run_dir), cfg.trainer.total_steps
    if step is None:
        if cfg.checkpoint.remote_dir is None:
            _check_something_to_resume(cfg, run_dir)
        return
    if step > total:
        raise ConfigError(
            f"{total}, but the run's latest checkpoint is at step {step}",
            where="trainer.total_steps",
            hint=f"resume with trainer.total_steps >= {step}",
        )
    if step == total and (run_dir / "summary.json").is_file():
        raise ConfigError(
            f"{total}: the run already finished at step {step} (summary.json)",
            where="trainer.total_steps",
            hint=f"resume with trainer.total_steps > {step} to train it further; `tandem eval {run_dir}` scores it",
        )


def _check_lora_base(cfg: TandemConfig, run_dir: Path) -> None:
    """A LoRA run's checkpoints hold the adapter only; its base weights are read from ``model.path`` again.
    Resumed on another base, the adapter trained on as if nothing changed (held-out accuracy fell to 0
    without a word). Refused when the run's recorded base and this one are both here and differ (their
    config.json or weight files); the same model moved to another path passes."""
    import yaml

    recorded = run_dir / "config.yaml"
    if not cfg.model.lora.enabled or not recorded.is_file():
        return
    before = ((yaml.safe_load(recorded.read_text(encoding="utf-8")) or {}).get("model") or {}).get("path")
    now = cfg.model.path
    if not before or before == now or "://" in f"{before}{now}":
        return
    old, new = _model_fingerprint(Path(before)), _model_fingerprint(Path(now))
    if old is not None and new is not None and old != new:
        raise ConfigError(
            f"{now}, but the run's LoRA adapter was trained on {before}, another model",
            where="model.path",
            hint=f"resume with model.path={before}: a LoRA checkpoint holds the adapter, not the base",
        )


def _model_fingerprint(folder: Path) -> tuple[str, tuple[tuple[str, int], ...]] | None:
    """What tells two model folders apart cheaply: config.json's text and the weight files' names and
    sizes; None for a folder that is not there."""
    config = folder / "config.json"
    if not config.is_file():
        return None
    weights = tuple(sorted((f.name, f.stat().st_size) for f in folder.glob("*.safetensors")))
    return config.read_text(encoding="utf-8"), weights


def _check_something_to_resume(cfg: TandemConfig, run_dir: Path) -> None:
    """Refuse ``--resume`` of a run folder whose metrics show trained steps but which holds no complete
    checkpoint (the run stopped before its first one, or the checkpoints were damaged or removed)."""
    metrics = run_dir / METRICS_FILE
    logged = metrics.is_file() and any(line.strip() for line in metrics.open(encoding="utf-8"))
    if logged:
        raise ConfigError(
            f"{run_dir} logged training steps but holds no complete checkpoint to resume from",
            where="--resume",
            hint=f"the run stopped before its first checkpoint (checkpoint.every={cfg.checkpoint.every}); "
            "start it over without --resume and with run.overwrite=true",
        )


def _record_changed_config(cfg: TandemConfig, run_dir: Path) -> Path | None:
    """On a resume whose resolved config differs from the one the run was started (or last resumed)
    with, keep the old one as ``config.before-step-N.yaml`` and warn with the keys that changed: the
    steps after N train with the new values, and ``config.yaml`` holds only those. An earlier record of
    the same step is never replaced (``config.before-step-N.2.yaml``, ...). Returns the file written."""
    import yaml

    old_path = run_dir / "config.yaml"
    if not old_path.is_file():
        return None
    text = old_path.read_text(encoding="utf-8")
    changes = [
        c
        for c in config_changes(yaml.safe_load(text) or {}, cfg.model_dump(mode="json"))
        if c[0] != "run.overwrite"
    ]
    changed = [key for key, _, _ in changes]
    if not changed:
        return None
    step = _latest_step(run_dir) or 0
    kept = run_dir / f"config.before-step-{step}.yaml"
    n = 1
    while kept.exists():
        n += 1
        kept = run_dir / f"config.before-step-{step}.{n}.yaml"
    atomic_write_text(kept, text)
    shown = ", ".join(f"{k}: {was!r} -> {now!r}" for k, was, now in changes[:8])
    more = f" (+{len(changed) - 8} more)" if len(changed) > 8 else ""
    horizon = _SCHEDULE_HORIZON.intersection(changed)
    if horizon and cfg.trainer.lr_schedule != "constant":
        more += (
            f"; {', '.join(sorted(horizon))} set the learning-rate schedule's length: it is recomputed over the "
            f"new one, so the rate jumps at step {step}"
        )
    log.warning(
        "resuming at step %d with a changed config: %s%s; the config before is kept in %s",
        step,
        shown,
        more,
        kept.name,
    )
    return kept


# the keys that set the run's optimiser steps, the horizon of a decaying learning-rate schedule
_SCHEDULE_HORIZON = frozenset(
    {
        "trainer.total_steps",
        "trainer.ppo_epochs",
        "trainer.mini_batch_size",
        "data.prompts_per_step",
        "rollout.n",
    }
)


@dataclass
class PreparedRunDir:
    """A run folder :func:`prepare_run_dir` created or reopened, and what it takes to put it back."""

    path: Path
    resumed: bool
    config_before: str | None = None  # resumed: config.yaml as the earlier run left it
    summary_before: str | None = None  # resumed: its summary.json (a finished run being extended)
    config_record: Path | None = None  # resumed: the config.before-step-N.yaml written for it

    def undo(self) -> None:
        """A run that fails before its first step leaves the folder as it found it: a new run's folder is
        removed (the corrected rerun must not find a "run" there), a resumed run gets its config.yaml and
        summary.json back and loses the config record this attempt wrote."""
        if not self.resumed:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        if self.config_before is not None:
            atomic_write_text(self.path / "config.yaml", self.config_before)
        if self.summary_before is not None:
            atomic_write_text(self.path / "summary.json", self.summary_before)
        if self.config_record is not None:
            self.config_record.unlink(missing_ok=True)


def prepare_run_dir(cfg: TandemConfig, *, resume: bool) -> PreparedRunDir:
    """Create (or reopen on resume) the run folder and write the resolved config into it.

    Call it after the run's pre-flight checks (:func:`check_run_dir`, building the model and rewards):
    a run that fails them must leave nothing behind, or the corrected rerun would find a "run" there; a
    failure after it and before the first step is undone with :meth:`PreparedRunDir.undo`.
    ``run.overwrite`` moves the old run aside in one rename before deleting it, so a crash never
    leaves a half-deleted run that still looks like one."""
    run_dir = check_run_dir(cfg, resume=resume)
    check_remote(cfg)  # checkpoint.remote_dir must be writable before any training
    if run_dir.is_dir() and any(run_dir.iterdir()) and not resume:
        # A fresh run must not inherit the old run's checkpoints (a later --resume would pick them up).
        discard_dir(run_dir, "replaced")
    prepared = PreparedRunDir(run_dir, resumed=resume and run_dir.is_dir())
    if prepared.resumed:
        prepared.config_before = _text_or_none(run_dir / "config.yaml")
        prepared.summary_before = _text_or_none(run_dir / "summary.json")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "summary.json").unlink(missing_ok=True)
    if resume:
        prepared.config_record = _record_changed_config(cfg, run_dir)
    atomic_write_text(run_dir / "config.yaml", config_to_yaml(cfg))
    (run_dir / METRICS_FILE).touch()  # with config.yaml: what marks a Tandem run folder
    if resume:  # checkpoint.remote_dir: continue from a newer copy there (e.g. on a fresh machine)
        fetch_newer_checkpoint(cfg, run_dir / "checkpoints")
        if cfg.checkpoint.remote_dir is not None and _latest_step(run_dir) is None:
            try:
                _check_something_to_resume(cfg, run_dir)
            except ConfigError:
                prepared.undo()
                raise
    return prepared


def _text_or_none(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.is_file() else None


def run_environment() -> dict[str, Any]:
    """What a run's floating-point results depend on besides its config and code.

    A seeded run is bit-reproducible only with the same library versions, the same CPU kernels (torch
    dispatches AVX2 or AVX-512 code by the host CPU; MKL and oneDNN pick their GEMM kernels the same way)
    and the same thread count. A 300-step RL run is chaotic in its float order, so two hosts differing
    only here land points apart (docs/benchmarks.md, the quickstart demo)."""

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "numpy": version("numpy"),
        "cpu": _cpu_name(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def _cpu_name() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else the machine type."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def finish_run(result: RunResult, ckpt_root: Path, **extra: Any) -> RunResult:
    """Fill ``eval_after`` and write ``summary.json`` last (atomically): the run is complete. It records
    :func:`run_environment`, so two runs' numbers can be compared knowing whether they could be equal."""
    result.eval_after = {k: v for k, v in result.last_metrics.items() if k.startswith("eval/")}
    summary = {
        "steps": result.steps,
        "eval_before": result.eval_before,
        "eval_after": result.eval_after,
        "final_metrics": result.last_metrics,
        "checkpoint": str(latest_checkpoint(ckpt_root) or ""),
        **({"best": result.best} if result.best else {}),
        "environment": run_environment(),
        **extra,
    }
    atomic_write_json(result.run_dir / "summary.json", summary)
    return result
