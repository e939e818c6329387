"""The entropy bonus coefficient's controller (``algorithm.entropy_target``).

A fixed ``algorithm.entropy_coef`` either does nothing (too small) or keeps the policy from sharpening at
all (too large), and the right value depends on the model and the task. Skywork-OR1 (He et al., 2025)
steers it instead: after every step the coefficient moves by a fixed ``step`` towards keeping the measured
token entropy at ``target`` —

    α <- min(α + step, α_max)   if H < target   (the policy is sharper than wanted: push entropy up)
    α <- max(α - step, 0)       otherwise       (enough exploration: let the bonus fade)

— so the bonus is only as strong, and only as long, as the entropy needs it. ``H`` is the step's mean
token entropy of the sampled responses (``actor/entropy``), the same quantity the bonus raises.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AdaptiveEntropy:
    """Bang-bang controller of the entropy coefficient ``value`` (see the module docstring)."""

    value: float
    target: float
    step: float
    max_value: float

    def __post_init__(self) -> None:
        if self.target <= 0 or self.step <= 0 or self.max_value < self.value or self.value < 0:
            raise ValueError(
                "AdaptiveEntropy needs target > 0, step > 0 and 0 <= value <= max_value, got "
                f"target={self.target}, step={self.step}, value={self.value}, max_value={self.max_value}"
            )

    def update(self, entropy: float) -> float:
        """Move the coefficient after a step whose measured mean token entropy was ``entropy``."""
        if entropy < self.target:
            self.value = min(self.value + self.step, self.max_value)
        else:
            self.value = max(self.value - self.step, 0.0)
        return self.value
