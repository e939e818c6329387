"""The arithmetic behind bench/learning.py: best evaluations, the issue-17 targets, the table."""

from __future__ import annotations

import math

import pytest
from bench_modules import load

lt = load("learning_table")
Eval, Run = lt.Eval, lt.Run


def run(system: str, lr: float, points: list[tuple[int, float, float]], cpu: float = 1.0) -> Run:
    """A run whose CPU seconds are ``cpu`` × its wall seconds."""
    return Run(system, lr, 0, tuple(Eval(s, a, w, cpu * w) for s, a, w in points))


def test_target_is_60_percent_or_start_plus_25_points_whichever_is_lower():
    assert lt.target_accuracy(0.15) == pytest.approx(0.40)
    assert lt.target_accuracy(0.35) == pytest.approx(0.60)
    assert lt.target_accuracy(0.50) == pytest.approx(0.60)


def test_best_eval_takes_the_earliest_of_equal_accuracies_within_the_step_limit():
    evals = [Eval(0, 0.1, 0, 0), Eval(20, 0.5, 10, 10), Eval(40, 0.5, 20, 20), Eval(400, 0.9, 200, 200)]
    assert lt.best_eval(evals, max_steps=300).step == 20
    assert lt.best_eval(evals).step == 400
    with pytest.raises(ValueError):
        lt.best_eval([Eval(400, 0.9, 1, 1)], max_steps=300)


def test_first_reaching_respects_the_step_limit_and_accepts_a_hit_exactly_on_the_target():
    evals = [Eval(0, 0.1, 0, 0), Eval(20, 0.3, 5, 5), Eval(40, 0.1 + 0.3, 9, 9), Eval(60, 0.7, 12, 12)]
    assert lt.first_reaching(evals, 0.4, 300).step == 40  # 0.1 + 0.3 < 0.4 in floats
    assert lt.first_reaching(evals, 0.6, 50) is None


def test_compare_meets_both_targets_when_tandem_hits_fast_enough():
    tandem = run("tandem", 6e-4, [(0, 0.15, 0), (20, 0.30, 10), (40, 0.42, 20), (60, 0.45, 30)])
    slow = run("trl", 2e-4, [(0, 0.15, 0), (20, 0.20, 30), (60, 0.38, 90)])
    best = run("trl", 6e-4, [(0, 0.15, 0), (20, 0.40, 30), (60, 0.40, 90)])
    row = lt.compare("countdown", tandem, [slow, best])
    assert row.target == pytest.approx(0.40)
    assert row.tandem_hit.step == 40 and row.tandem_best.step == 60
    assert row.trl_lr == 6e-4 and row.trl_best[6e-4].step == 20  # earliest of its equal bests
    assert row.ratio == pytest.approx(20 / 30)  # Tandem's wall to target / TRL's wall to its best
    assert row.acc_met and not row.time_met  # 0.67 > 1/3
    fast = run("trl", 6e-4, [(0, 0.15, 0), (20, 0.30, 30), (100, 0.40, 60)], cpu=0.5)
    row = lt.compare("countdown", tandem, [fast])
    assert row.ratio == pytest.approx(20 / 60) and row.time_met
    assert row.cpu_ratio == pytest.approx(20 / 30)  # the time target is judged on wall time


def test_compare_without_a_hit_uses_tandems_best_and_meets_nothing():
    tandem = run("tandem", 6e-4, [(0, 0.05, 0), (20, 0.10, 5), (40, 0.08, 10)])
    trl = run("trl", 2e-4, [(0, 0.05, 0), (20, 0.06, 100)])
    row = lt.compare("add2", tandem, [trl])
    assert row.tandem_hit is None and row.ratio == pytest.approx(5 / 100)
    assert not row.acc_met and not row.time_met


def test_trl_that_never_improves_gives_an_infinite_ratio_and_ties_pick_the_faster_lr():
    tandem = run("tandem", 6e-4, [(0, 0.05, 0), (20, 0.31, 5)])
    flat = run("trl", 2e-3, [(0, 0.05, 0), (20, 0.0, 10)])
    row = lt.compare("add2", tandem, [flat])
    assert math.isinf(row.ratio) and row.acc_met and not row.time_met
    a = run("trl", 2e-4, [(0, 0.05, 0), (20, 0.2, 50)])
    b = run("trl", 6e-4, [(0, 0.05, 0), (20, 0.2, 40)])
    assert lt.compare("add2", tandem, [a, b]).trl_lr == 6e-4
    with pytest.raises(ValueError):
        lt.compare("add2", tandem, [])


def test_tandem_time_to_trls_best_accuracy_is_measured_against_trls_time_to_it():
    tandem = run("tandem", 6e-4, [(0, 0.34, 0), (30, 0.40, 30), (60, 0.44, 60), (90, 0.45, 90)], cpu=0.25)
    trl = run("trl", 6e-4, [(0, 0.34, 0), (60, 0.38, 100), (120, 0.44, 200), (180, 0.43, 300)], cpu=0.5)
    row = lt.compare("countdown-mid", tandem, [trl])
    assert row.tandem_match.step == 60  # first Tandem evaluation at or above TRL's best (44 %)
    assert row.match_ratio == pytest.approx(60 / 200) and row.match_cpu_ratio == pytest.approx(15 / 100)
    assert row.ratio == pytest.approx(90 / 200)  # the target is missed: Tandem's best against TRL's
    assert "| @60: 0.30 (0.15) |" in lt.format_table([row])
    behind = run("tandem", 6e-4, [(0, 0.34, 0), (30, 0.43, 30)])
    row = lt.compare("countdown-mid", behind, [trl])
    assert row.tandem_match is None and math.isinf(row.match_ratio)
    assert "| not reached | not met | not met |" in lt.format_table([row])


def test_format_table_has_one_column_per_trl_lr_and_one_row_per_start():
    tandem = run("tandem", 6e-4, [(0, 0.15, 0), (20, 0.42, 20)])
    rows = [
        lt.compare("countdown", tandem, [run("trl", 2e-4, [(0, 0.15, 0), (20, 0.2, 90)])]),
        lt.compare("add2", tandem, [run("trl", 6e-4, [(0, 0.15, 0)])]),
    ]
    text = lt.format_table(rows).splitlines()
    assert len(text) == 4
    assert "TRL lr 0.0002 best" in text[0] and "TRL lr 0.0006 best" in text[0]
    assert all(line.count("|") == text[0].count("|") for line in text)
    assert (
        "42.0 % @20 (20 s, CPU 20 s)" in text[2] and "0.22 (0.22)" in text[2] and "| met | met |" in text[2]
    )
    assert "| @20: 0.22 (0.22) |" in text[2]  # Tandem reached TRL's best (20 %) at step 20
    assert "inf (TRL best at step 0)" in text[3] and "| - |" in text[3]
    flat = run("tandem", 6e-4, [(0, 0.15, 0), (20, 0.10, 20)])
    row = lt.compare("sub2", flat, [run("trl", 2e-4, [(0, 0.15, 0), (20, 0.2, 90)])])
    assert row.ratio == 0 and "- (Tandem best at step 0)" in lt.format_table([row])


def test_format_table_prints_a_dash_for_an_unknown_cpu_clock():
    # A decoupled run's learner and worker share no CPU clock: bench/learning.py records NaN.
    tandem = run("tandem", 6e-4, [(0, 0.15, 0), (20, 0.42, 20)], cpu=math.nan)
    row = lt.compare("add2", tandem, [run("trl", 2e-4, [(0, 0.15, 0), (20, 0.42, 90)])])
    text = lt.format_table([row])
    assert "42.0 % @20 (20 s, CPU - s)" in text and "0.22 (-)" in text and "@20: 0.22 (-)" in text
    assert "nan" not in text


def test_far_apart_warns_only_when_two_known_finish_times_are_over_the_limit():
    assert lt.far_apart({"Tandem": 1000.0, "TRL lr 0.0006": 1000.0 + 3600}) is None
    # a result recorded before the bench kept finish times
    assert lt.far_apart({"Tandem": 1000.0, "TRL lr 0.0006": None}) is None
    note = lt.far_apart({"Tandem": 1000.0 + 3 * 3600, "TRL lr 0.0002": 1000.0, "TRL lr 0.0006": 2000.0})
    assert note is not None
    assert note.startswith("TRL lr 0.0002 and Tandem finished 3.0 h apart")


def test_run_from_result_reads_a_results_line():
    line = {
        "system": "trl",
        "lr": 6e-4,
        "seed": 2,
        "evals": [{"step": 0, "acc": 0.3, "wall": 0.0, "cpu": 0.0}],
    }
    assert lt.run_from_result(line) == Run("trl", 6e-4, 2, (Eval(0, 0.3, 0.0, 0.0),))


def test_best_lr_takes_the_highest_mean_best_over_seeds_and_ties_go_to_the_faster():
    runs = [
        run("trl", 2e-4, [(0, 0.3, 0), (100, 0.70, 50)]),  # one lucky seed ...
        run("trl", 2e-4, [(0, 0.3, 0), (100, 0.40, 50)]),  # ... and one bad: mean 0.55
        run("trl", 6e-4, [(0, 0.3, 0), (100, 0.60, 50)]),
        run("trl", 6e-4, [(0, 0.3, 0), (100, 0.60, 50)]),  # mean 0.60
        run("trl", 2e-3, [(0, 0.3, 0), (50, 0.60, 20)]),  # mean 0.60, reached sooner
    ]
    assert lt.best_lr(runs) == 2e-3
    assert lt.best_lr(runs[:4]) == 6e-4
    with pytest.raises(ValueError):
        lt.best_lr([])


def test_mean_curve_averages_the_seeds_at_the_steps_all_of_them_evaluated():
    a = run("tandem", 0.0, [(0, 0.2, 0), (25, 0.4, 10), (50, 0.6, 20)], cpu=2.0)
    b = run("tandem", 0.0, [(0, 0.2, 0), (50, 0.8, 30)], cpu=2.0)
    mean = lt.mean_curve([a, b])
    assert [e.step for e in mean] == [0, 50]
    assert mean[1].acc == pytest.approx(0.7)
    assert (mean[1].wall, mean[1].cpu) == (pytest.approx(25.0), pytest.approx(50.0))
    with pytest.raises(ValueError):
        lt.mean_curve([])
