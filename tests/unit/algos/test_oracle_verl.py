"""Tandem's algorithms against peer implementations as oracles: verl 0.9.1's ``core_algos.py`` and TRL
1.16's DPO loss, on random inputs.

The checks live in ``bench/algos_oracle.py`` (which also prints them as a table); here each group of
checks is one test, over three seeds. A check either agrees with the peer, or differs by a convention
documented in ``docs/algorithms.md`` — then the peer must match the documented formula and Tandem must
differ from it. ``make test`` installs both (TRL with the dev extra, verl's source with ``--no-deps``: verl
pins an older transformers); elsewhere, without them, these tests skip and say how to install them.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch

ORACLE = Path(__file__).resolve().parents[3] / "bench" / "algos_oracle.py"
SEEDS = range(3)


def _load_oracle() -> types.ModuleType:
    if "algos_oracle" not in sys.modules:
        spec = importlib.util.spec_from_file_location("algos_oracle", ORACLE)
        assert spec is not None and spec.loader is not None
        sys.modules["algos_oracle"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["algos_oracle"])
    return sys.modules["algos_oracle"]


oracle = _load_oracle()


@pytest.fixture(scope="module")
def verl():
    try:
        return oracle.load_verl()
    except oracle.PeerUnavailableError as err:
        print(f"skipping the verl oracle: {err}")
        pytest.skip(str(err))


def _assert_all_hold(checks: list) -> None:
    assert checks, "no checks ran"
    failed = [c.describe() for c in checks if not c.holds()]
    assert not failed, "\n".join(failed)
    unkeyed = [c.item for c in checks if c.relation != "agrees" and c.key not in oracle.CONVENTIONS]
    assert not unkeyed, f"differences without a row in the conventions table: {unkeyed}"


@pytest.mark.parametrize("group", list(oracle.VERL_GROUPS))
def test_tandem_matches_verl_or_differs_as_documented(verl, group: str) -> None:
    checks = [c for seed in SEEDS for c in oracle.VERL_GROUPS[group](verl, seed)]
    _assert_all_hold(checks)


@pytest.mark.slow  # importing TRL takes ~10 s
def test_dpo_losses_match_trl_or_differ_as_documented() -> None:
    try:
        trl_loss = oracle.load_trl_dpo()
    except oracle.PeerUnavailableError as err:
        print(f"skipping the TRL oracle: {err}")
        pytest.skip(str(err))
    _assert_all_hold([c for seed in SEEDS for c in oracle.dpo_checks(trl_loss, seed)])


def test_every_convention_difference_is_documented() -> None:
    """Every convention the oracle knows has a row in docs/algorithms.md's conventions table."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "algorithms.md").read_text()
    assert "## Conventions and how they compare to verl and TRL" in doc
    section = doc.split("## Conventions and how they compare to verl and TRL", 1)[1]
    for key in oracle.CONVENTIONS:
        assert f"`{key}`" in section, f"docs/algorithms.md conventions table lacks `{key}`"


def test_oracle_checks_can_fail() -> None:
    """The relations are not vacuous: an 'agrees' check with different tensors fails, and a 'differs'
    check fails when ours equals the peer or the peer leaves the documented formula."""
    a, b = torch.zeros(3), torch.ones(3)
    assert not oracle.Check("x", "agrees", a, b).holds()
    assert not oracle.Check("x", "differs", a, a, a).holds()
    assert not oracle.Check("x", "differs", a, b, a).holds()
    assert oracle.Check("x", "differs", a, b, b).holds()
    assert not oracle.Check("x", "tandem", b, a).holds()
