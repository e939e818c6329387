"""Alert state in checkpoints: the rules' history (AlertEngine) and the controller's rollback count survive
a JSON round trip exactly, so a resumed run raises the alerts an uninterrupted one raises."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.config import build_config
from tandem.config.schema import AlertRuleConfig
from tandem.monitor.alerts import AlertEngine
from tandem.orchestration.alerting import AlertController

RULES = [
    AlertRuleConfig(metric="len", kind="growth", threshold=1.5, min_history=3, action="skip"),
    AlertRuleConfig(metric="g", kind="spike", threshold=2.0, window=4, min_history=2, action="warn"),
    AlertRuleConfig(metric="kl", kind="above", threshold=0.5, patience=2, action="stop"),
    AlertRuleConfig(metric="kl", kind="above", threshold=0.5, action="warn"),  # same label as the one above
    AlertRuleConfig(
        metric="r", kind="diverge", against="eval", threshold=0.1, window=3, min_history=2, action="stop"
    ),
]

value = st.floats(0.0, 3.0, allow_nan=False) | st.none()
step_metrics = st.fixed_dictionaries(
    {}, optional={"len": value, "g": value, "kl": value, "r": value, "eval": st.floats(0.0, 1.0)}
)


def _json(state: dict) -> dict:
    """What a checkpoint's state.json gives back."""
    return json.loads(json.dumps(state, allow_nan=False))


@settings(max_examples=60, deadline=None)
@given(seq=st.lists(step_metrics, min_size=1, max_size=14), data=st.data())
def test_resumed_engine_fires_as_an_uninterrupted_one(seq, data):
    k = data.draw(st.integers(0, len(seq)))
    whole = AlertEngine(RULES)
    expected = [whole.check(i, m) for i, m in enumerate(seq, start=1)]
    first = AlertEngine(RULES)
    got = [first.check(i, m) for i, m in enumerate(seq[:k], start=1)]
    resumed = AlertEngine(RULES)
    resumed.load_state_dict(_json(first.state_dict()))
    got += [resumed.check(i, m) for i, m in enumerate(seq[k:], start=k + 1)]
    assert got == expected
    assert resumed.state_dict() == _json(whole.state_dict())


def test_growth_baseline_and_warn_incident_survive_the_round_trip():
    rules = [
        AlertRuleConfig(metric="len", kind="growth", threshold=2.0, min_history=2, action="stop"),
        AlertRuleConfig(metric="kl", kind="above", threshold=0.5, action="warn"),
    ]
    before = AlertEngine(rules)
    before.check(1, {"len": 10.0, "kl": 0.9})  # warn fires: incident open
    before.check(2, {"len": 10.0, "kl": 0.9})
    after = AlertEngine(rules)
    after.load_state_dict(_json(before.state_dict()))
    # a fresh engine would take 30 as its baseline and re-send the open warning
    assert [a.rule for a in after.check(3, {"len": 30.0, "kl": 0.9})] == ["len:growth"]


def test_changed_rules_on_resume_keep_what_still_matches():
    old = AlertEngine([AlertRuleConfig(metric="g", kind="spike", threshold=2.0, window=5, min_history=1)])
    for i, v in enumerate([1.0, 2.0, 3.0, 4.0, 5.0], start=1):
        old.check(i, {"g": v})
    new_rules = [
        AlertRuleConfig(metric="g", kind="spike", threshold=9.0, window=2, min_history=1),  # same label
        AlertRuleConfig(metric="len", kind="growth", threshold=2.0),  # new: starts fresh
    ]
    engine = AlertEngine(new_rules)
    engine.load_state_dict(_json(old.state_dict()))
    spike, growth = engine.state_dict()["rules"]
    assert spike["recent"] == [4.0, 5.0] and spike["first"] == [1.0]  # cut to the new window
    assert growth["recent"] == [] and growth["first"] == []
    engine.load_state_dict({"rules": []})  # nothing saved: every rule fresh
    assert all(r["recent"] == [] for r in engine.state_dict()["rules"])


@pytest.mark.parametrize("bad", [{}, {"rules": [{"key": ["g:spike", "g", "spike"]}]}, {"rules": 3}])
def test_malformed_engine_state_is_a_value_error_and_keeps_the_history(bad):
    engine = AlertEngine([AlertRuleConfig(metric="g", kind="spike", threshold=2.0, min_history=1)])
    engine.check(1, {"g": 1.0})
    with pytest.raises(ValueError, match="malformed alert history"):
        engine.load_state_dict(bad)
    assert engine.state_dict()["rules"][0]["recent"] == [1.0]


# -- the controller ---------------------------------------------------------------------------------------


def _cfg(**monitor):
    rule = {"metric": "x", "kind": "spike", "threshold": 2.0, "min_history": 1, "action": "rollback"}
    data = {"model": {"path": "unused"}, "data": {"task": "arith"}, "monitor": {"alerts": [rule], **monitor}}
    return build_config(data)


class _Trainer:
    """What a rollback acts on: load_checkpoint returns the extra state saved in the checkpoint."""

    pre_update = None

    def __init__(self, extra_state: dict) -> None:
        self.step = 5
        self.extra_state = extra_state
        self.optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        self.learn = SimpleNamespace(live_optimizer=lambda: (self.optimizer, None))

    def load_checkpoint(self, folder: Path, parts: object) -> dict:
        return {"extra_state": self.extra_state}

    def restore(self, extra_state: dict, *, rollback: bool = False) -> None:
        self.step = 2

    def sync_ranks(self) -> None:
        pass


def _controller(tmp_path: Path, trainer: _Trainer, **monitor) -> AlertController:
    return AlertController(_cfg(**monitor), tmp_path, trainer, show=lambda _: None)


def test_controller_state_round_trip_keeps_rollbacks_and_history(tmp_path):
    before = _controller(tmp_path, _Trainer({}))
    before.after_step(1, {"x": 1.0})
    before.rollbacks, before._pending_scale = 2, 0.25
    after = _controller(tmp_path, _Trainer({}))
    after.load_state_dict(_json(before.state_dict()))
    assert after.rollbacks == 2 and after._pending_scale == 0.25
    assert after.engine.state_dict() == _json(before.engine.state_dict())
    with pytest.raises(ValueError, match="malformed alert state"):
        after.load_state_dict({"engine": {"rules": []}})  # no rollback count


def test_rollback_rewinds_the_history_but_the_count_only_grows(tmp_path):
    (tmp_path / "checkpoints" / "step-00000002").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step-00000002" / "COMPLETE").write_text("")
    at_checkpoint = _controller(tmp_path, _Trainer({}))
    at_checkpoint.after_step(1, {"x": 1.0})
    at_checkpoint.after_step(2, {"x": 1.0})
    saved = _json(at_checkpoint.state_dict())  # rollbacks 0 at the checkpoint
    trainer = _Trainer({"alerts": saved})
    alerting = _controller(tmp_path, trainer, max_rollbacks=5)
    alerting.rollbacks = 3
    for step, x in enumerate([1.0, 1.0, 1.0, 1.0, 9.0], start=1):
        outcome = alerting.after_step(step, {"x": x})
    assert outcome == "rollback"
    alerting.rollback(parts=None)
    assert alerting.rollbacks == 4  # not the checkpoint's 0
    assert alerting.engine.state_dict() == saved["engine"]  # steps 3-5 undone: their values forgotten
    trainer.extra_state = {}  # an older version's checkpoint: the history is kept as it is
    history = alerting.engine.state_dict()
    alerting.rollback(parts=None)
    assert alerting.rollbacks == 5 and alerting.engine.state_dict() == history
