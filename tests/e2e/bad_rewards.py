"""Misbehaving reward functions (TRL signature) for the CLI bad-input tests, plus ones that behave."""

import math


def raises(prompts, completions, **columns):
    raise ValueError("reward exploded")


def wrong_length(prompts, completions, **columns):
    return [0.0] * (len(completions) + 1)


def returns_nan(prompts, completions, **columns):
    return [math.nan] * len(completions)


def raises_on_marked(prompts, completions, **columns):
    """Raises for any batch holding a prompt that contains 'BOOM'; 1.0 for every other sample."""
    if any("BOOM" in p for p in prompts):
        raise ValueError("marked prompt")
    return [1.0] * len(completions)


def starts_with_answer(prompts, completions, answer, **columns):
    """1.0 where the completion starts with the row's ``answer`` column (a reward that needs a column)."""
    return [float(c.startswith(a)) for c, a in zip(completions, answer, strict=True)]
