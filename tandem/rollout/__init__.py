"""Rollout (layer L2): the engine interface, the engine table and its Hugging Face backend."""

from tandem.rollout.base import EngineSpec, RolloutEngine, SamplingParams
from tandem.rollout.hf import HFEngine
from tandem.rollout.registry import DEFAULT_ENGINE, ENGINES, IN_PROCESS_ENGINE, build_engine

__all__ = [
    "DEFAULT_ENGINE",
    "ENGINES",
    "EngineSpec",
    "HFEngine",
    "IN_PROCESS_ENGINE",
    "RolloutEngine",
    "SamplingParams",
    "build_engine",
]
