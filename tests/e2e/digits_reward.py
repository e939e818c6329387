"""A trivially learnable reward for learning tests (TRL signature): share of digit characters."""


def digit_share(prompts, completions, **columns):
    return [sum(c.isdigit() for c in text) / max(1, len(text)) for text in completions]


def slow_digit_share(prompts, completions, **columns):
    """``digit_share`` that takes 0.5 s per batch: a rollout side slower than the learner (autoscaling)."""
    import time

    time.sleep(0.5)
    return digit_share(prompts, completions)


def even_length(prompts, completions, **columns):
    """1.0 for an even-length completion: groups of a few samples are sometimes all equal (DAPO filter)."""
    return [float(len(text) % 2 == 0) for text in completions]
