"""The registry of built-in tasks (name -> factory taking the task's options) and ``get_task``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from tandem.algos.registry import Registry, UnknownNameError
from tandem.errors import ConfigError
from tandem.rewards.tasks.arith import ArithTask
from tandem.rewards.tasks.base import Task
from tandem.rewards.tasks.calculator import CalculatorTask
from tandem.rewards.tasks.countdown import CountdownTask
from tandem.rewards.tasks.guess import GuessTask
from tandem.rewards.tasks.reverse import ReverseTask
from tandem.rewards.tasks.safety import SafetyTask

TaskFactory = Callable[..., Task]

TASKS: Registry[TaskFactory] = Registry("task")
TASKS.add(ArithTask.name, ArithTask)
TASKS.add(CountdownTask.name, CountdownTask)
TASKS.add(ReverseTask.name, ReverseTask)
TASKS.add(SafetyTask.name, SafetyTask)
TASKS.add(CalculatorTask.name, CalculatorTask)
TASKS.add(GuessTask.name, GuessTask)


def get_task(name: str, **options: Any) -> Task:
    """Task ``name`` built with ``options``. ConfigError for an unknown name (listing the valid ones), an
    unknown option (listing the task's options) or an invalid option value."""
    try:
        factory = TASKS.get(name)
    except UnknownNameError as err:
        raise ConfigError(str(err)) from None
    valid = [p for p in inspect.signature(factory).parameters if not p.startswith("_")]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ConfigError(
            f"unknown option(s) {', '.join(unknown)} for task '{name}'",
            hint=f"valid options: {', '.join(valid) or 'none'}",
        )
    return factory(**options)
