"""The layout chart: matplotlib when installed, else a hand-written SVG (and PNG refused with the extra)."""

from __future__ import annotations

import builtins
import xml.etree.ElementTree as ET

import pytest

from tandem.errors import MissingDependencyError
from tandem.plan.cost import PhaseTimes
from tandem.plan.layouts import Candidate
from tandem.plan.plot import plot_candidates
from tandem.plan.simulate import Layout, SimResult


def cands() -> list[Candidate]:
    def one(layout: Layout, rate: float) -> Candidate:
        res = SimResult(1 / rate, rate, 0.5, 0.5, 0.0, {layout.staleness: 1.0}, 0, 10)
        return Candidate(layout, 4, 4, PhaseTimes(generate=1.0), res)

    return [one(Layout(mode="decoupled", staleness=2, workers=2), 3.0), one(Layout(), 1.5)]


@pytest.fixture
def no_matplotlib(monkeypatch):
    real = builtins.__import__

    def fake(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake)


def test_svg_without_matplotlib(tmp_path, no_matplotlib):
    c = cands()
    path = plot_candidates(c, tmp_path / "plan.svg", best=c[0])
    root = ET.parse(path).getroot()  # well-formed XML
    widths = [float(r.get("width")) for r in root.iter("{http://www.w3.org/2000/svg}rect")]
    assert widths[0] == pytest.approx(2 * widths[1])  # bars scale with samples/s
    assert "recommended" in path.read_text() and "split 4:4 η=2" in path.read_text()


def test_png_without_matplotlib_names_the_extra(tmp_path, no_matplotlib):
    with pytest.raises(MissingDependencyError, match=r"tandem-rl\[report\]"):
        plot_candidates(cands(), tmp_path / "plan.png")
