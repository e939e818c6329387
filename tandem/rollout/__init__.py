"""Rollout (layer L2): the engine interface and its Hugging Face backend."""

from tandem.rollout.base import RolloutEngine, SamplingParams
from tandem.rollout.hf import HFEngine

__all__ = ["HFEngine", "RolloutEngine", "SamplingParams"]
