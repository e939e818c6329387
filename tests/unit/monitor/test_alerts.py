"""Alert rules (pure engine), the alert sink and the webhook, with a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from pydantic import ValidationError

from tandem.config.schema import ALERT_PRESETS, AlertRuleConfig, MonitorConfig
from tandem.monitor.alerts import AlertEngine, AlertSink, post_webhook, read_alerts, system_metrics


def rule(**kw) -> AlertRuleConfig:
    return AlertRuleConfig(**kw)


def run(engine: AlertEngine, seq: list[dict]) -> list[int]:
    """Steps (1-based) at which any alert fired."""
    return [i for i, m in enumerate(seq, start=1) if engine.check(i, m)]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, None])
def test_nonfinite_fires_on_nan_inf_and_null(bad):
    e = AlertEngine([rule(metric="actor/pg_loss", kind="nonfinite", action="skip")])
    seq = [{"actor/pg_loss": 0.1}, {"actor/pg_loss": bad}, {"actor/pg_loss": 0.2}, {}]
    assert run(e, seq) == [2]


def test_above_below_thresholds():
    e = AlertEngine(
        [
            rule(metric="actor/kl", kind="above", threshold=0.5, action="stop"),
            rule(metric="actor/entropy", kind="below", threshold=0.1, action="stop"),
        ]
    )
    seq = [
        {"actor/kl": 0.5, "actor/entropy": 0.1},
        {"actor/kl": 0.51, "actor/entropy": 1.0},
        {"actor/kl": 0.1, "actor/entropy": 0.09},
    ]
    assert run(e, seq) == [2, 3]


def test_spike_relative_to_running_median_needs_history():
    e = AlertEngine([rule(metric="g", kind="spike", threshold=5.0, window=4, min_history=3, action="stop")])
    # An early large value cannot fire (no history); later, 5× the running median does.
    seq = [{"g": 100.0}, {"g": 1.0}, {"g": 1.0}, {"g": 1.2}, {"g": 1.1}, {"g": 5.2}, {"g": 6.0}]
    # step 6: median(1.0, 1.0, 1.2, 1.1) = 1.05 -> 5.2 < 5.25; step 7: median(1.0, 1.2, 1.1, 5.2) = 1.15 -> 6 > 5.75
    assert run(e, seq) == [7]


def test_patience_needs_consecutive_checks_and_steps_without_the_metric_do_not_break_them():
    e = AlertEngine([rule(metric="actor/kl", kind="above", threshold=0.5, patience=2, action="stop")])
    seq = [{"actor/kl": 0.9}, {"actor/kl": 0.1}, {"actor/kl": 0.9}, {}, {"actor/kl": 0.8}, {"actor/kl": 0.7}]
    assert run(e, seq) == [5, 6]  # 1 alone; 3 and 5 are consecutive checks (step 4 has no kl)
    warn = AlertEngine([rule(metric="actor/kl", kind="above", threshold=0.5, patience=2, action="warn")])
    assert run(warn, seq) == [5]  # warn: once per incident


def test_reward_hacking_preset_ignores_one_noisy_evaluation_and_fires_on_a_second():
    """The quickstart's held-out accuracy once dipped 0.775 -> 0.67 for one evaluation and recovered; the
    preset (patience 2) stays quiet there and warns when the fall holds at the next evaluation."""
    e = AlertEngine([AlertRuleConfig(**ALERT_PRESETS["reward_hacking"])])
    base = [{"reward/mean": 0.4, "eval/reward_mean": 0.6}, {"reward/mean": 0.5, "eval/reward_mean": 0.775}]
    dip = [{"reward/mean": 0.58, "eval/reward_mean": 0.67}, {"reward/mean": 0.6}, {"reward/mean": 0.62}]
    recovered = [{"reward/mean": 0.65, "eval/reward_mean": 0.79}]
    assert run(e, base + dip + recovered) == []
    e = AlertEngine([AlertRuleConfig(**ALERT_PRESETS["reward_hacking"])])
    held = [{"reward/mean": 0.65, "eval/reward_mean": 0.6}]
    assert run(e, base + dip + held) == [6]


def test_growth_against_first_values():
    e = AlertEngine([rule(metric="len", kind="growth", threshold=2.0, min_history=2, action="stop")])
    seq = [{"len": 4.0}, {"len": 6.0}, {"len": 9.0}, {"len": 10.5}]  # base 5.0
    assert run(e, seq) == [4]


def test_diverge_train_up_heldout_down():
    e = AlertEngine(
        [
            rule(
                metric="reward/mean",
                kind="diverge",
                against="eval/reward_mean",
                threshold=0.1,
                window=5,
                min_history=2,
                action="stop",
            )
        ]
    )
    seq = [
        {"reward/mean": 0.2, "eval/reward_mean": 0.5},
        {"reward/mean": 0.3},  # no eval this step: cannot fire
        {"reward/mean": 0.4, "eval/reward_mean": 0.55},
        {"reward/mean": 0.5, "eval/reward_mean": 0.50},  # dropped 0.05 only
        {"reward/mean": 0.6, "eval/reward_mean": 0.40},  # dropped 0.15 from best while train rose
    ]
    assert run(e, seq) == [5]
    # Both falling together is not reward hacking.
    e2 = AlertEngine(e.rules)
    assert (
        run(
            e2, [{"reward/mean": 0.5, "eval/reward_mean": 0.5}, {"reward/mean": 0.2, "eval/reward_mean": 0.2}]
        )
        == []
    )


def test_warn_fires_once_per_incident_other_actions_every_step():
    warn = AlertEngine([rule(metric="x", kind="above", threshold=1.0, action="warn")])
    seq = [{"x": 2.0}, {"x": 3.0}, {"x": 0.0}, {"x": 2.0}]
    assert run(warn, seq) == [1, 4]
    stop = AlertEngine([rule(metric="x", kind="above", threshold=1.0, action="skip")])
    assert run(stop, seq) == [1, 2, 4]


def test_veto_only_skip_rules_and_no_history():
    e = AlertEngine(
        [
            rule(metric="actor/grad_norm", kind="spike", threshold=3.0, min_history=1, action="skip"),
            rule(metric="actor/grad_norm", kind="above", threshold=0.0, action="warn"),
        ]
    )
    assert e.veto({"actor/grad_norm": 10.0}) == []  # no history yet
    e.check(1, {"actor/grad_norm": 1.0})
    vetoed = e.veto({"actor/grad_norm": 10.0})
    assert [a.action for a in vetoed] == ["skip"]
    assert e.veto({"actor/grad_norm": 2.0}) == []


def test_presets_and_config_validation():
    m = MonitorConfig(
        alerts=["nan_loss", {"metric": "actor/kl", "kind": "above", "threshold": 2, "action": "rollback"}]
    )
    assert m.alerts[0].metric == ALERT_PRESETS["nan_loss"]["metric"] and m.alerts[0].name == "nan_loss"
    assert m.alerts[1].action == "rollback"
    assert {r.name for r in MonitorConfig().alerts} == set(ALERT_PRESETS)
    assert MonitorConfig(alerts=[]).alerts == []
    with pytest.raises(ValidationError, match="unknown alert preset 'nope'"):
        MonitorConfig(alerts=["nope"])
    with pytest.raises(ValidationError, match="needs a threshold"):
        AlertRuleConfig(metric="actor/kl", kind="above")
    with pytest.raises(ValidationError, match="needs `against`"):
        AlertRuleConfig(metric="reward/mean", kind="diverge", threshold=0.1)


class _Hook(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):  # noqa: N802 - http.server API
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((self.headers["Content-Type"], json.loads(body)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def webhook():
    _Hook.received = []
    server = HTTPServer(("127.0.0.1", 0), _Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/hook", _Hook.received
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_sink_writes_jsonl_shows_and_posts(tmp_path, webhook):
    url, received = webhook
    shown = []
    sink = AlertSink(tmp_path, webhook=url, show=shown.append, run="r1")
    e = AlertEngine([rule(name="kl_high", metric="actor/kl", kind="above", threshold=1.0)])
    (alert,) = e.check(3, {"actor/kl": 2.5})
    sink.emit(alert, effect="logged")
    sink.close()
    rows = read_alerts(tmp_path)
    assert rows[0]["step"] == 3 and rows[0]["rule"] == "kl_high" and rows[0]["effect"] == "logged"
    assert shown and "actor/kl = 2.5 above 1" in shown[0]
    ctype, payload = received[0]
    assert ctype == "application/json" and payload["run"] == "r1" and payload["value"] == 2.5


def test_webhook_failure_is_not_fatal(caplog):
    assert post_webhook("http://127.0.0.1:9/none", {"a": 1}, timeout=0.5) is False
    assert "webhook" in caplog.text


def test_system_metrics_fraction():
    m = system_metrics()
    assert 0.0 < m["system/host_mem_frac"] < 1.0
