"""bench/learning.py --plot: which runs are drawn, and that the figure is written."""

from __future__ import annotations

from bench_modules import load

load("learning_table")  # learning_plot reads it from sys.modules, as bench/learning.py loads it
lp = load("learning_plot")


def result(
    start: str, system: str, lr: float, seed: int, accs: list[float], variant: str = "default"
) -> dict:
    evals = [{"step": 25 * i, "acc": a, "wall": 10.0 * i, "cpu": 10.0 * i} for i, a in enumerate(accs)]
    return {"start": start, "system": system, "lr": lr, "seed": seed, "variant": variant, "evals": evals}


RESULTS = [
    result("add2-mid", "tandem", 0.0, 0, [0.34, 0.5, 0.6], variant="plain"),
    result("add2-mid", "trl", 2e-4, 0, [0.34, 0.4, 0.5]),
    result("add2-mid", "tandem", 0.0, 0, [0.34, 0.55, 0.62]),
    result("add2-mid", "trl", 6e-4, 0, [0.34, 0.45, 0.58]),
    result("add2-mid", "trl", 6e-4, 1, [0.34, 0.45, 0.56]),
    result("add2-mid", "tandem", 0.0, 1, [0.34, 0.52, 0.61]),
    result("sub2-mid", "tandem", 0.0, 0, [0.40, 0.6, 0.6]),
]


def test_series_puts_the_default_recipe_first_and_trl_at_its_best_mean_lr():
    drawn = lp.series(RESULTS, "add2-mid", max_steps=300)
    assert [label for label, _ in drawn] == ["Tandem", "Tandem (plain)", "TRL lr 0.0006"]
    assert [len(runs) for _, runs in drawn] == [2, 1, 2]
    assert {r.seed for r in drawn[2][1]} == {0, 1}
    assert [label for label, _ in lp.series(RESULTS, "sub2-mid", 300)] == ["Tandem"]  # no TRL run: none drawn


def test_plot_writes_a_png_into_a_new_folder(tmp_path):
    out = tmp_path / "fig" / "learning.png"
    lp.plot(RESULTS, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
