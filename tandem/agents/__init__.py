"""Agents: environments, tool calls and the sandbox that multi-turn rollouts run against.

Pure Python, no model libraries: an environment sees text actions and returns text observations and rewards;
the token-exact episode loop that drives an engine against it lives in ``tandem.rollout``.
"""
