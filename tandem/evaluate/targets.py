"""Resolve what the user points ``tandem eval`` / ``tandem abtest`` at, and the eval prompts to use.

A target is a run folder (its latest complete checkpoint is used), a checkpoint folder
(``checkpoints/step-N``, whose ``model/`` is used), a run's ``best/`` model (``checkpoint.best_metric``), a
plain Hugging Face model folder or an export folder
(``tandem export``; an INT8 export is loaded as ``tandem serve`` loads it). When the target
lies inside a run, the run's ``config.yaml`` supplies the task, held-out size, seed and generation
settings, so the evaluation sees exactly the prompts the training loop evaluated.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem.config import load_config
from tandem.config.schema import TandemConfig
from tandem.data import load_prompt_dataset, rows_from_task
from tandem.data.outputs import BEST_RECORD, EXPORT_MARKER
from tandem.errors import ConfigError, ModelError
from tandem.rewards import RewardFunction, RewardSet, TrainerState, get_task, load_callable
from tandem.rewards.tasks import Task

_STEP_DIR = re.compile(r"^step-(\d+)$")
_COMPLETE = "COMPLETE"  # marker written last into a finished checkpoint (see tandem.train.checkpoint)


@dataclass
class Target:
    """A model folder to evaluate and, if it belongs to one, its run folder and resolved config."""

    model_dir: Path
    run_dir: Path | None = None
    config: TandemConfig | None = None
    state: TrainerState | None = None  # the reward functions' trainer_state when the run evaluated it

    @property
    def label(self) -> str:
        return str(self.model_dir)


def latest_complete_checkpoint(ckpt_root: Path) -> Path | None:
    """Highest-step ``step-N`` folder holding the COMPLETE marker (partial checkpoints are ignored)."""
    found = []
    for child in ckpt_root.iterdir() if ckpt_root.is_dir() else []:
        m = _STEP_DIR.match(child.name)
        if m and (child / _COMPLETE).is_file():
            found.append((int(m.group(1)), child))
    return max(found)[1] if found else None


def resolve_target(path: str | Path) -> Target:
    """Turn a run / checkpoint / model folder into a :class:`Target`; ModelError names the path."""
    p = Path(path)
    if not p.exists():
        raise ModelError("no such run, checkpoint or model folder", where=str(p))
    if (p / "checkpoints").is_dir():
        ckpt = latest_complete_checkpoint(p / "checkpoints")
        if ckpt is None:
            raise ModelError("run has no complete checkpoint", where=str(p / "checkpoints"))
        return Target(ckpt / "model", p, _run_config(p), _checkpoint_state(ckpt))
    if (p / "model").is_dir() and (p / _COMPLETE).is_file():
        run = p.parent.parent if p.parent.name == "checkpoints" else None
        return Target(p / "model", run, _run_config(run) if run else None, _checkpoint_state(p))
    if (p / BEST_RECORD).is_file() and (p.parent / "checkpoints").is_dir():  # a run's best/ model
        return Target(p, p.parent, _run_config(p.parent), _recorded_state(_json(p / BEST_RECORD)))
    if (p / "config.json").is_file() or (p / EXPORT_MARKER).is_file():
        return Target(p)
    raise ModelError(
        "not a run folder, checkpoint, model folder or export folder",
        where=str(p),
        hint="pass runs/NAME, runs/NAME/checkpoints/step-N, a folder with config.json or a tandem export",
    )


def _json(path: Path) -> Any:
    """A JSON file's content; None when it is missing or unreadable (a record, not an input)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _recorded_state(record: Any) -> TrainerState | None:
    """The reward functions' ``trainer_state`` in a record the run wrote beside a model it kept (None
    for a run saved before the record existed)."""
    return TrainerState.from_json(record.get("trainer_state") if isinstance(record, dict) else None)


def _checkpoint_state(ckpt: Path) -> TrainerState | None:
    """The ``trainer_state`` a checkpoint's run recorded at its step (:func:`_recorded_state`)."""
    state = _json(ckpt / "state.json")
    return _recorded_state(state.get("extra_state") if isinstance(state, dict) else None)


def _run_config(run_dir: Path) -> TandemConfig | None:
    """The run's resolved config; a config this version cannot read is an error that says how to go on."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return None
    try:
        return load_config(path)
    except ConfigError as exc:
        raise ConfigError(
            f"{exc} — cannot read the run's config",
            hint=f"evaluate the model folder directly with --task: {run_dir}/checkpoints/step-N/model",
        ) from None


@dataclass
class EvalData:
    """Prompt rows and the verifier that scores them, plus the generation limits they were made for."""

    rows: list[dict[str, Any]]
    rewards: RewardSet | None
    source: str
    max_new_tokens: int = 32
    stop: list[str] = field(default_factory=list)
    max_prompt_len: int | None = None
    task: Task | None = None  # the built-in task the rows come from (None for an eval file)


def eval_data(
    config: TandemConfig | None,
    *,
    task: str | None = None,
    task_options: dict[str, Any] | None = None,
    eval_file: str | None = None,
    reward: str | None = None,
    size: int | None = None,
    seed: int | None = None,
    require_rewards: bool = True,
    exclude: Collection[str] = (),
    token_ids: bool = True,
) -> EvalData:
    """Held-out prompts: explicit ``task``/``eval_file`` options win, else the run config's data section.

    For a task the verifier scores; for a file, ``reward`` (``module:function``) or the config's functions
    (with ``require_rewards=False`` a file may come without one: ``rewards`` is then None). A task's rows
    leave out the prompts in ``exclude`` (e.g. the held-out set a choice was made on): the first ``size``
    of the test split's draw that are not in it. A file's reward functions must find the arguments they need
    among its columns (and ``completion_ids``, where the caller scores with them: ``token_ids``).
    """
    data = config.data if config is not None else None
    task = task or (data.task if data and not eval_file else None)
    eval_file = eval_file or (data.eval_file if data and not task else None)
    seed = seed if seed is not None else (config.run.seed if config else 0)
    gen = {}
    if config is not None:
        r = config.rollout
        gen = {
            "max_new_tokens": r.max_new_tokens,
            "stop": list(r.stop),
            "max_prompt_len": data.max_prompt_len,
        }
    if task is not None:
        opts = (
            task_options
            if task_options is not None
            else (data.task_options if data and data.task == task else {})
        )
        t = get_task(task, **opts)
        n = size if size is not None else (data.eval_size if data and data.eval_size else 200)
        ds = rows_from_task(t, "test", n + len(exclude), seed)
        rows = [r for r in ds.rows if r["prompt"] not in exclude][:n] if exclude else ds.rows
        source = (
            f"{ds.source} (seed {seed}, none of {len(exclude)} excluded prompts)" if exclude else ds.source
        )
        rewards = RewardSet([RewardFunction(name=t.name, fn=t.reward, weight=1.0)], on_error="raise")
        return EvalData(rows, rewards, source, **gen, task=t)
    if eval_file is None:
        raise ConfigError(
            "nothing to evaluate on", where="--task", hint="pass --task NAME or --eval-file FILE"
        )
    ds = load_prompt_dataset(eval_file)
    rows = ds.rows[:size] if size else ds.rows
    has_fns = reward is not None or (config is not None and bool(config.reward.functions))
    rewards = _file_rewards(config, reward) if has_fns or require_rewards else None
    if rewards is not None:
        rewards.check_columns(ds.extra_columns, source=ds.source, token_ids=token_ids)
    return EvalData(rows, rewards, ds.source, **gen)


def _file_rewards(config: TandemConfig | None, reward: str | None) -> RewardSet:
    if reward is not None:
        fn = load_callable(reward, key="--reward")
        name = getattr(fn, "__name__", reward)
        return RewardSet([RewardFunction(name=name, fn=fn, weight=1.0, source=reward)])
    if config is not None and config.reward.functions:
        fns = [
            RewardFunction.from_spec(s.path, name=s.name, weight=s.weight, key=f"reward.functions.{i}.path")
            for i, s in enumerate(config.reward.functions)
        ]
        return RewardSet(fns, on_error=config.reward.on_error, timeout_s=config.reward.timeout_s)
    raise ConfigError(
        "an eval file needs a reward function", where="--reward", hint="pass --reward module:function"
    )
