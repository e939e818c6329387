"""A trivially learnable reward for learning tests (TRL signature): share of digit characters."""


def digit_share(prompts, completions, **columns):
    return [sum(c.isdigit() for c in text) / max(1, len(text)) for text in completions]
