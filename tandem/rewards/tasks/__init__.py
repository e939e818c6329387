"""Built-in verifiable tasks (``arith``, ``countdown``, ``reverse``) and their registry.

``get_task("arith", digits=3)`` builds a task; ``task.make_rows("train", 512, seed=0)`` generates rows and
``task.reward(prompts, completions, **columns)`` scores completions. See :mod:`tandem.rewards.tasks.base`
for the split rule that keeps train and test prompts disjoint.
"""

from tandem.rewards.tasks.arith import ArithTask
from tandem.rewards.tasks.base import SPLITS, GeneratedTask, Task, split_of
from tandem.rewards.tasks.countdown import CountdownTask
from tandem.rewards.tasks.registry import TASKS, TaskFactory, get_task
from tandem.rewards.tasks.reverse import ReverseTask

__all__ = [
    "SPLITS",
    "TASKS",
    "ArithTask",
    "CountdownTask",
    "GeneratedTask",
    "ReverseTask",
    "Task",
    "TaskFactory",
    "get_task",
    "split_of",
]
