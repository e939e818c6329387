"""Weighted sets of reward functions in TRL's signature, with validated outputs.

A reward function is ``f(prompts, completions, **columns) -> list[float | None]``; extra dataset columns
arrive as keyword lists. ``None`` means "not applicable": the value contributes nothing to the sample's
score. As in TRL, ``prompts`` and ``completions`` are passed by name, so ``f(completions, **kwargs)`` and
``f(completions, solution, **kwargs)`` work (:class:`Binding`); a function that names them otherwise takes
them by position. Where the caller has them, the samples' token ids arrive as ``completion_ids=`` (as in
TRL), and the run's progress as ``trainer_state=`` (:class:`TrainerState`, TRL's ``global_step``,
``max_steps`` and ``epoch``; None outside a training run). A function without ``**kwargs`` gets only the
columns it names, and :meth:`RewardSet.check_columns` refuses, before a run starts, one that needs an
argument no column provides. :class:`RewardSet` calls every function once per batch, checks what comes
back, and returns the weighted sum as a ``[B]`` tensor plus per-function values and metrics. ``async def``
functions (a judge behind an HTTP API) run concurrently with each other, as in TRL.

Bad outputs (wrong length, NaN/inf, non-numbers) always raise :class:`~tandem.errors.RewardError`. A
function that *raises* stops the step with ``on_error="raise"``; with ``on_error="skip"`` the batch is
retried one sample at a time, the samples that still raise get 0 from that function, are counted in
``reward/errors`` and logged. With ``timeout_s`` a function that has not returned in time counts as one
that raised (``skip``: the whole batch gets 0 from it, not retried, counted in ``reward/<fn>/errors``): plain
functions then run on daemon threads, so a hung one is left behind instead of stalling the run.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import numbers
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from tandem.errors import ConfigError, RewardError
from tandem.rewards.loading import callable_origin, load_callable

logger = logging.getLogger(__name__)

RewardFn = Callable[..., Sequence[float | None]]
OnError = Literal["raise", "skip"]
_RESERVED = ("prompts", "completions")
COMPLETION_IDS = "completion_ids"  # TRL's keyword for the samples' token ids
TRAINER_STATE = "trainer_state"  # TRL's keyword for the run's progress
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


@dataclass(frozen=True)
class TrainerState:
    """The run's progress when a batch is scored, passed as ``trainer_state=`` (the fields of TRL's
    ``TrainerState`` that reward schedules read: ``if trainer_state.global_step < 100: ...``)."""

    global_step: int  # optimiser steps done before this batch's update (0 for the first batch)
    max_steps: int  # trainer.total_steps
    epoch: float  # training prompts drawn before this batch / prompts in the training file

    def to_json(self) -> dict[str, Any]:
        """The record a saved model keeps of the state it was evaluated at (``best.json``, a
        checkpoint's ``state.json``), read back by :meth:`from_json`."""
        return {"global_step": self.global_step, "max_steps": self.max_steps, "epoch": self.epoch}

    @classmethod
    def from_json(cls, record: Any) -> TrainerState | None:
        """The state in a record written by :meth:`to_json`; None for anything else (a run saved before
        the record existed)."""
        if not isinstance(record, dict):
            return None
        try:
            return cls(int(record["global_step"]), int(record["max_steps"]), float(record["epoch"]))
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class Binding:
    """How a reward function takes its arguments, read once from its signature.

    ``by_name``: ``prompts=`` and ``completions=`` as keywords (TRL's call; the function names either of
    them, or takes keywords only), else as the first two positional arguments. ``accepted``: the keyword
    names it takes (None: any, it has ``**kwargs``). ``required``: the names it needs besides the prompts
    and completions (no default)."""

    by_name: bool = False
    accepted: frozenset[str] | None = None
    required: tuple[str, ...] = ()

    @classmethod
    def of(cls, fn: Callable[..., Any]) -> Binding:
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):  # no signature to read (some builtins): the documented call
            return cls()
        names = {p.name for p in params if p.kind in _NAMED}
        positional = [p for p in params if p.kind in _POSITIONAL]
        varargs = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
        by_name = bool(names & set(_RESERVED)) or (len(positional) < 2 and not varargs)
        skipped = set(_RESERVED) if by_name else {p.name for p in positional[:2]}
        required = tuple(
            p.name
            for p in params
            if p.kind in _NAMED and p.default is inspect.Parameter.empty and p.name not in skipped
        )
        any_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        accepted = None if any_keyword else frozenset(names if by_name else names - skipped)
        return cls(by_name=by_name, accepted=accepted, required=required)

    def call(
        self,
        fn: Callable[..., Any],
        prompts: list[Any],
        completions: list[Any],
        columns: Mapping[str, Any],
        passed: Mapping[str, Any] | None = None,
    ) -> Any:
        """``fn`` on one batch; ``passed``: what the caller adds to the columns (``completion_ids``,
        ``trainer_state``). Keywords it does not take are left out (``f(completions)`` gets no
        ``prompts=``). An ``async def`` function returns its coroutine."""
        if passed:
            columns = {**columns, **passed}
        kwargs = {"prompts": prompts, "completions": completions, **columns} if self.by_name else columns
        if self.accepted is not None:
            kwargs = {k: v for k, v in kwargs.items() if k in self.accepted}
        return fn(**kwargs) if self.by_name else fn(prompts, completions, **kwargs)


@dataclass(frozen=True)
class RewardFunction:
    """A named reward callable and its weight in the total score. ``source``: where it came from (the
    config's ``path``), named in errors instead of the callable's module."""

    name: str
    fn: RewardFn
    weight: float = 1.0
    source: str | None = None
    binding: Binding = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ConfigError(f"reward name {self.name!r} must be non-empty and contain no '/'")
        if not callable(self.fn):
            raise ConfigError(f"reward '{self.name}' is a {type(self.fn).__name__}, not a callable")
        if isinstance(self.weight, bool) or not isinstance(self.weight, numbers.Real):
            raise ConfigError(f"reward '{self.name}' weight must be a number, got {self.weight!r}")
        if not math.isfinite(self.weight):
            raise ConfigError(f"reward '{self.name}' weight must be finite, got {self.weight}")
        object.__setattr__(self, "binding", Binding.of(self.fn))

    @classmethod
    def from_spec(
        cls,
        spec: str,
        *,
        weight: float = 1.0,
        name: str | None = None,
        key: str | None = None,
        base_dir: str | Path | None = None,
    ) -> RewardFunction:
        """Load ``module:function`` or ``file.py:function``; the name defaults to the attribute name."""
        fn = load_callable(spec, key=key, base_dir=base_dir)
        return cls(name=name or spec.rpartition(":")[2].split(".")[-1], fn=fn, weight=weight, source=spec)

    @property
    def origin(self) -> str:
        """Where the callable came from, named in error messages: ``source``, else ``module:qualname``."""
        return self.source or callable_origin(self.fn)

    def __call__(
        self,
        prompts: list[Any],
        completions: list[Any],
        columns: Mapping[str, Any],
        passed: Mapping[str, Any] | None = None,
    ) -> Any:
        """The function's raw output on a batch (an awaitable for an ``async def`` one), with the
        arguments it takes (:class:`Binding`)."""
        return self.binding.call(self.fn, prompts, completions, columns, passed)


@dataclass
class RewardResult:
    """Scores of one batch.

    ``per_function[name]`` holds that function's raw (unweighted) values, NaN where it returned None.
    """

    scores: torch.Tensor  # [B] float32, weighted sum over applicable functions (0 where none applies)
    per_function: dict[str, torch.Tensor]  # name -> [B] float32, NaN = not applicable
    metrics: dict[str, float] = field(default_factory=dict)


class RewardSet:
    """Several reward functions with weights, evaluated together on a batch. An empty set scores 0 (a
    run whose rewards all come from its environment's episodes)."""

    def __init__(
        self,
        functions: Sequence[RewardFunction],
        *,
        on_error: OnError = "raise",
        timeout_s: float | None = None,
    ) -> None:
        names = [f.name for f in functions]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError(
                f"duplicate reward name(s): {', '.join(dupes)}", hint="give each a distinct name"
            )
        if on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if timeout_s is not None and not timeout_s > 0:
            raise ConfigError(f"timeout_s must be > 0, got {timeout_s}", where="reward.timeout_s")
        self.functions = list(functions)
        self.on_error: OnError = on_error
        self.timeout_s = timeout_s

    def check_columns(
        self, columns: Collection[str], *, source: str = "the dataset", token_ids: bool = True
    ) -> None:
        """Refuse, before anything runs, a function that needs an argument none of ``columns`` (the
        dataset's extra columns) provides — nor ``completion_ids``, where the caller passes them
        (``token_ids``), nor ``trainer_state`` (always passed, None outside training): a one-line
        ConfigError naming the function and the columns."""
        given = {*columns, TRAINER_STATE, *((COMPLETION_IDS,) if token_ids else ())}
        for rf in self.functions:
            missing = [n for n in rf.binding.required if n not in given]
            if missing:
                have = ", ".join(sorted(columns)) or "none besides 'prompt'"
                raise ConfigError(
                    f"reward '{rf.name}' ({rf.origin}) needs {_quoted(missing)}, which no column of "
                    f"{source} provides (its columns: {have})",
                    hint="add the column, give the argument a default, or take **kwargs",
                )

    def __call__(
        self,
        prompts: list[str],
        completions: list[str],
        columns: Mapping[str, Sequence[Any]] | None = None,
        *,
        completion_ids: list[list[int]] | None = None,
        trainer_state: TrainerState | None = None,
    ) -> RewardResult:
        """Score a batch. ``columns`` maps extra dataset column names to one value per completion;
        ``completion_ids``: each completion's token ids, for functions that take them; ``trainer_state``:
        the run's progress (None outside training)."""
        columns = dict(columns or {})
        size = _check_batch(prompts, completions, columns)
        if completion_ids is not None and len(completion_ids) != size:
            raise ValueError(f"got {len(completion_ids)} completion_ids for {size} completions")
        shared: dict[str, Any] = {TRAINER_STATE: trainer_state}
        if completion_ids is not None:
            shared[COMPLETION_IDS] = completion_ids
        outputs = self._run(
            [lambda rf=rf: rf(prompts, completions, columns, shared) for rf in self.functions]
        )
        total = torch.zeros(size, dtype=torch.float64)
        applicable = torch.zeros(size, dtype=torch.bool)
        failed = torch.zeros(size, dtype=torch.bool)
        per_function: dict[str, torch.Tensor] = {}
        metrics: dict[str, float] = {}
        for rf, out in zip(self.functions, outputs, strict=True):
            values, errors = self._evaluate(rf, out, prompts, completions, columns, shared)
            raw = torch.tensor([math.nan if v is None else v for v in values], dtype=torch.float64)
            used = ~torch.isnan(raw)
            total += torch.where(used, raw * rf.weight, 0.0)
            applicable |= used
            failed |= errors
            per_function[rf.name] = raw.float()
            metrics.update(_function_metrics(rf.name, raw, used, errors))
        none_count = int((~applicable).sum())
        metrics["reward/none_count"] = float(none_count)
        metrics["reward/none_frac"] = none_count / size if size else 0.0
        metrics["reward/errors"] = float(failed.sum())
        return RewardResult(scores=total.float(), per_function=per_function, metrics=metrics)

    def _evaluate(
        self,
        rf: RewardFunction,
        out: Any,
        prompts: list[str],
        completions: list[str],
        columns: dict[str, Sequence[Any]],
        shared: dict[str, Any],
    ) -> tuple[list[float | None], torch.Tensor]:
        """Values of one function for the batch from its output ``out`` (or the exception it raised), and
        a [B] bool mask of samples where it raised."""
        size = len(completions)
        if not isinstance(out, Exception):
            return _checked(rf, out, size), torch.zeros(size, dtype=torch.bool)
        if self.on_error == "raise":
            raise _raised(rf, out) from out
        if isinstance(out, RewardTimeoutError):  # a retry per sample would wait up to size times as long
            logger.warning("%s; the batch scores 0 from it", _raised(rf, out))
            return [0.0] * size, torch.ones(size, dtype=torch.bool)
        logger.warning("%s; retrying sample by sample", _raised(rf, out))
        ids = shared.get(COMPLETION_IDS)

        def one(i: int) -> Callable[[], Any]:
            cols = {k: [v[i]] for k, v in columns.items()}
            passed = {**shared, **({} if ids is None else {COMPLETION_IDS: [ids[i]]})}
            return lambda: rf([prompts[i]], [completions[i]], cols, passed)

        outs = self._run([one(i) for i in range(size)], together=False)
        values: list[float | None] = []
        errors = torch.zeros(size, dtype=torch.bool)
        for i, single in enumerate(outs):
            if isinstance(single, Exception):
                values.append(0.0)
                errors[i] = True
            else:
                values.append(_checked(rf, single, 1)[0])
        if bool(errors.any()):
            failed = errors.nonzero().flatten().tolist()
            first = outs[failed[0]]
            assert isinstance(first, Exception)
            logger.warning(
                "%s on %d of %d samples (first: index %d); they score 0 from it",
                _raised(rf, first),
                len(failed),
                size,
                failed[0],
            )
        return values, errors

    def _run(self, calls: list[Callable[[], Any]], *, together: bool = True) -> list[Any]:
        """Each call's result, awaitables awaited (all concurrently), or the Exception it raised; with
        ``timeout_s``, :class:`RewardTimeoutError` for one that did not finish in time. ``together``: the
        calls are different functions, each on its own thread; else they are one function's per-sample
        retries, run one after another on one thread (a plain function is never run concurrently with
        itself) within one limit."""
        if self.timeout_s is None:
            return _gathered([_attempt(call) for call in calls])
        if together:
            return _gathered(_threaded(calls, self.timeout_s), self.timeout_s)
        (outs,) = _threaded([lambda: [_attempt(call) for call in calls]], self.timeout_s)
        if isinstance(outs, Exception):  # the limit passed before the last sample was scored
            return [outs] * len(calls)
        return _gathered(outs, self.timeout_s)


class RewardTimeoutError(Exception):
    """A reward function did not return within ``reward.timeout_s``."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no result after {seconds:g} s (reward.timeout_s)")


def _threaded(calls: list[Callable[[], Any]], timeout_s: float) -> list[Any]:
    """Run ``calls`` on daemon threads at once and wait for each until ``timeout_s`` after the start: its
    result (an awaitable for an ``async def`` function, awaited later), the Exception it raised, or
    :class:`RewardTimeoutError`. A thread that never returns is left running (daemon: it does not hold up the
    process's exit)."""
    boxes: list[list[Any]] = [[] for _ in calls]

    def run(call: Callable[[], Any], box: list[Any]) -> None:
        box.append(_attempt(call))

    threads = [
        threading.Thread(target=run, args=(call, box), daemon=True, name="tandem-reward")
        for call, box in zip(calls, boxes, strict=True)
    ]
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [box[0] if box else RewardTimeoutError(timeout_s) for box in boxes]


def _attempt(call: Callable[[], Any]) -> Any:
    """``call()``'s result (a coroutine for an ``async def`` function), or the Exception it raised."""
    try:
        return call()
    except Exception as err:
        return err


def _gathered(outputs: list[Any], timeout_s: float | None = None) -> list[Any]:
    """``outputs`` with every awaitable among them awaited, all concurrently in one event loop (an
    exception in place of the value of one that raised; :class:`RewardTimeoutError` for one still running
    ``timeout_s`` after they started). In a thread that already runs a loop (a notebook, an async server)
    the loop runs in a helper thread."""
    pending = [i for i, out in enumerate(outputs) if inspect.isawaitable(out)]
    if not pending:
        return outputs

    async def gather() -> list[Any]:
        return await asyncio.gather(*(_awaited(outputs[i], timeout_s) for i in pending))

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        done = asyncio.run(gather())
    else:
        with ThreadPoolExecutor(1) as pool:
            done = pool.submit(asyncio.run, gather()).result()
    resolved = list(outputs)
    for i, value in zip(pending, done, strict=True):
        resolved[i] = value
    return resolved


async def _awaited(awaitable: Awaitable[Any], timeout_s: float | None) -> Any:
    """The awaitable's value or the Exception it raised; :class:`RewardTimeoutError` (and cancelled) when
    still running after ``timeout_s`` (a TimeoutError of the function's own stays its own)."""
    task = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if not done:
        task.cancel()
        return RewardTimeoutError(timeout_s or 0.0)
    error = task.exception()
    if error is None:
        return task.result()
    if isinstance(error, Exception):
        return error
    raise error


def _quoted(names: Sequence[str]) -> str:
    return ("argument " if len(names) == 1 else "arguments ") + ", ".join(f"'{n}'" for n in names)


def _check_batch(prompts: list[str], completions: list[str], columns: dict[str, Sequence[Any]]) -> int:
    size = len(completions)
    if len(prompts) != size:
        raise ValueError(f"got {len(prompts)} prompts for {size} completions")
    for name, values in columns.items():
        if name in (*_RESERVED, COMPLETION_IDS, TRAINER_STATE):
            raise RewardError(
                f"dataset column '{name}' clashes with the reward argument of the same name", hint="rename it"
            )
        if len(values) != size:
            raise ValueError(f"column '{name}' has {len(values)} values for {size} completions")
    return size


def _raised(rf: RewardFunction, err: BaseException) -> RewardError:
    if isinstance(err, RewardTimeoutError):
        return RewardError(f"reward '{rf.name}' timed out: {err} ({rf.origin})")
    message = f": {str(err).splitlines()[0]}" if str(err).strip() else ""
    return RewardError(f"reward '{rf.name}' raised {type(err).__name__}{message} ({rf.origin})")


def _checked(rf: RewardFunction, out: Any, size: int) -> list[float | None]:
    """``out`` as a list of finite floats or None, or a RewardError naming the function and index."""
    if not isinstance(out, (list, tuple)) and hasattr(out, "tolist"):
        out = out.tolist()  # torch tensor or numpy array
    if isinstance(out, (str, bytes)) or not isinstance(out, Sequence):
        raise RewardError(
            f"reward '{rf.name}' returned {type(out).__name__}, expected a list of {size} floats ({rf.origin})"
        )
    if len(out) != size:
        raise RewardError(
            f"reward '{rf.name}' returned {len(out)} values for {size} completions; "
            f"expected length {size} ({rf.origin})"
        )
    values: list[float | None] = []
    for i, v in enumerate(out):
        if v is None:
            values.append(None)
            continue
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = v.item()
        if not isinstance(v, numbers.Real):
            raise RewardError(
                f"reward '{rf.name}' returned {type(v).__name__} {v!r:.40} at index {i}, "
                f"expected a float or None ({rf.origin})"
            )
        try:
            value = float(v)
        except OverflowError:  # an int past float's range
            value = math.inf
        if not math.isfinite(value):
            raise RewardError(f"reward '{rf.name}' returned {v!r:.40} at index {i} ({rf.origin})")
        if abs(value) > FLOAT32_MAX:  # scores are float32 tensors: it would become inf there
            raise RewardError(
                f"reward '{rf.name}' returned {v!r:.40} at index {i}, beyond the float32 range of scores "
                f"(±3.4e38) ({rf.origin})"
            )
        values.append(value)
    return values


FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def _function_metrics(
    name: str, raw: torch.Tensor, used: torch.Tensor, errors: torch.Tensor
) -> dict[str, float]:
    """Mean over applicable samples (omitted when none applies), fraction of None, error count."""
    size = raw.numel()
    out = {
        f"reward/{name}/none_frac": float((~used).sum()) / size if size else 0.0,
        f"reward/{name}/errors": float(errors.sum()),
    }
    if bool(used.any()):
        out[f"reward/{name}/mean"] = float(raw[used].mean())
    return out
