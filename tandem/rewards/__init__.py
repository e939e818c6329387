"""Rewards: verifiable built-in tasks, TRL-style reward plugins with weights, format rewards, shaping."""

from tandem.rewards.format import format_regex
from tandem.rewards.functions import RewardFunction, RewardResult, RewardSet, TrainerState
from tandem.rewards.loading import load_callable
from tandem.rewards.shaping import overlong_shaping
from tandem.rewards.tasks import TASKS, Task, get_task

__all__ = [
    "TASKS",
    "RewardFunction",
    "RewardResult",
    "RewardSet",
    "Task",
    "TrainerState",
    "format_regex",
    "get_task",
    "load_callable",
    "overlong_shaping",
]
