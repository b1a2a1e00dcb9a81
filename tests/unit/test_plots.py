"""Figures of the offline commands: written where asked, valid PNGs of the stated size, with
something drawn; a missing matplotlib is one error line before any work; the docs'
figures come from the script in the repository."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from controlplane.cli import app
from controlplane.plots.capacity_curve import write_capacity_curve
from controlplane.plots.common import DEFAULT_SIZE, Size
from controlplane.replay.engine import ReplayResult
from controlplane.simulate.engine import SimOptions
from controlplane.simulate.report import SimResult
from controlplane.traces.synth import synthesize
from controlplane.traces.writer import write_bailian
from tests.conftest import REPO

SAMPLE = REPO / "tests" / "data" / "mooncake_synthetic.jsonl.gz"
TRACE_FIGURES = ["hit_share_by_turn.png", "lifespan_cdf.png", "reuse_time_cdf.png", "skew.png"]


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's header, after checking its signature."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", path
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def assert_image(path: Path, size: Size = DEFAULT_SIZE) -> None:
    """A PNG of ``size`` that decodes whole and is not blank."""
    from matplotlib.image import imread

    assert png_size(path) == (size.width, size.height)
    pixels = imread(path)
    assert pixels.shape[:2] == (size.height, size.width)
    drawn = (pixels[..., :3] < 0.9).any(axis=-1).mean()
    assert drawn > 0.01, f"{path} is almost blank"


@pytest.fixture(scope="module")
def toc_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plots") / "toc.jsonl"
    write_bailian(synthesize("to-c", duration_s=300, qps=4, seed=5), path)
    return path


def test_trace_stats_draws_every_figure_of_a_labelled_trace(toc_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "figures"  # made: the folder named, in an existing one
    res = CliRunner().invoke(app, ["trace", "stats", str(toc_file), "--plot", str(out)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == TRACE_FIGURES
    for name in TRACE_FIGURES:
        assert_image(out / name)
        assert f"wrote {out / name}" in res.stderr
    assert "ideal hit ratio" in res.stdout  # the table still prints


def test_a_mooncake_trace_skips_the_turn_figure_and_says_why(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app, ["trace", "stats", str(SAMPLE), "--plot", str(tmp_path), "--json"]
    )
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        set(TRACE_FIGURES) - {"hit_share_by_turn.png"}
    )
    assert "skipped hit_share_by_turn:\n  the trace has no turn numbers" in res.stderr
    assert json.loads(res.stdout)["requests"] == 3993


def test_replay_plot_draws_the_bounds_it_was_not_asked_for(tmp_path: Path) -> None:
    out = tmp_path / "curve.png"
    args = ["replay", str(SAMPLE), "-p", "lru,s3fifo", "--capacity", "1000,4000,16000"]
    res = CliRunner().invoke(app, [*args, "--plot", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert_image(out)
    runs = {r["policy"] for r in json.loads(res.stdout)["results"]}
    assert runs == {"lru", "s3fifo", "belady", "inf"}


def test_a_figure_is_written_at_the_size_asked(tmp_path: Path) -> None:
    results = [
        ReplayResult("t", policy, capacity, hits=int(ratio * 1000), accesses=1000)
        for policy, ratios in (("lru", (0.1, 0.3)), ("belady", (0.2, 0.4)), ("inf", (0.5, 0.5)))
        for capacity, ratio in zip((10, 100), ratios, strict=True)
    ]
    size = Size(640, 400)
    path = write_capacity_curve(tmp_path / "c.png", results, 1000, "t", size)
    assert_image(path, size)
    with pytest.raises(ValueError, match="100 to 10,000 pixels"):
        Size(50, 400)


def test_without_matplotlib_plotting_fails_before_any_work(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    for args in (
        ["replay", str(SAMPLE), "-p", "lru", "--plot", str(tmp_path / "c.png")],
        ["trace", "stats", str(SAMPLE), "--plot", str(tmp_path / "d")],
    ):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2, res.output
        # kvwise is not on PyPI: the hint installs the extra from a checkout, not by name
        want = (
            "error: --plot: plots need matplotlib, kvwise's plot extra: "
            "pip install '.[plot]' in a kvwise checkout"
        )
        assert res.stderr.strip() == want
        assert res.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_replay_refuses_a_plot_file_that_is_not_png_before_replaying(tmp_path: Path) -> None:
    args = ["replay", str(SAMPLE), "-p", "lru", "--plot", str(tmp_path / "c.svg")]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert res.exit_code == 2
    assert res.stderr.strip() == f"error: --plot: {tmp_path / 'c.svg'}: plots are written as .png"
    assert res.stdout == "" and "replay:" not in res.stderr


def test_replay_refuses_a_plot_it_could_not_write_before_replaying(tmp_path: Path) -> None:
    """A folder for a name, a missing folder (never made: a typo leaves no tree behind)
    or a place that takes no file fails before the replay."""
    (tmp_path / "c.png").mkdir()
    deep = tmp_path / "new" / "folder" / "c.png"
    places = [
        (tmp_path / "c.png", "is a folder"),
        (deep, f"{deep}: folder {deep.parent} does not exist"),
    ]
    if Path("/proc").is_dir():
        places.append((Path("/proc/c.png"), "cannot create a file in /proc"))
    for path, says in places:
        args = ["replay", str(SAMPLE), "-p", "lru", "--plot", str(path)]
        res = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
        assert res.exit_code == 2 and says in res.stderr, res.output
        assert res.stdout == "" and "replay:" not in res.stderr
    assert not (tmp_path / "new").exists()


def test_trace_stats_makes_the_folder_named_but_not_its_parents(
    toc_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "missing" / "figures"
    res = CliRunner().invoke(app, ["trace", "stats", str(toc_file), "--plot", str(out)])
    assert res.exit_code == 2
    assert f"--plot: {out}: folder {out.parent} does not exist" in res.stderr
    assert not out.parent.exists()


@pytest.mark.slow
def test_the_docs_figures_come_from_the_script(tmp_path: Path) -> None:
    """The script writes every figure docs/ shows (on a short trace here)."""
    docs = (REPO / "docs").glob("*.md")
    shown = {name for page in docs for name in _figure_links(page.read_text())}
    assert len(shown) >= 5
    script = REPO / "docs" / "figures" / "make_figures.py"
    cmd = [sys.executable, str(script), "--out", str(tmp_path), "--duration", "120"]
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, timeout=900)
    assert {p.name for p in tmp_path.iterdir()} == shown
    for name in shown:
        assert (REPO / "docs" / "figures" / name).is_file()
        assert png_size(tmp_path / name) == (DEFAULT_SIZE.width, DEFAULT_SIZE.height)


def _figure_links(markdown: str) -> list[str]:
    parts = markdown.split("](figures/")[1:]
    return [p.split(")")[0] for p in parts]


def test_cdf_points_are_thinned_but_keep_both_ends() -> None:
    from controlplane.plots.trace_figures import CDF_POINTS, _cdf

    values = np.random.default_rng(0).exponential(size=50_000)
    x, y = _cdf(values)
    assert len(x) <= CDF_POINTS and y[-1] == 1.0 and x[-1] == values.max()
    assert np.all(np.diff(x) >= 0) and np.all(np.diff(y) > 0)


def test_trace_stats_says_a_plot_folder_that_is_a_file_is_a_file(tmp_path: Path) -> None:
    """It said only 'File exists', after reading the trace."""
    taken = tmp_path / "toc.jsonl"
    taken.write_text("")
    args = ["trace", "stats", str(SAMPLE), "--plot", str(taken)]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert res.exit_code == 2
    assert res.stderr.strip() == (
        f"error: --plot: {taken} is a file: it takes a folder for the figures"
    )


def sim_results(quantiles: list[float]) -> list[SimResult]:
    """lru and wa at two sizes whose QTTFT CDF at the smaller goes over ``quantiles``
    (0.01 apart), the rest of each result as a real run made it."""
    from dataclasses import replace

    from controlplane.simulate.report import QUANTILES
    from controlplane.simulate.runner import SimJob, run_one
    from controlplane.traces.reader import load_trace

    base = run_one(load_trace(SAMPLE), SimJob("lru", 400), SimOptions(instances=4))
    xs = np.interp(np.linspace(0, 1, len(QUANTILES)), np.linspace(0, 1, len(quantiles)), quantiles)
    return [
        replace(base, policy=policy, capacity=capacity, qttft_quantiles=tuple(xs * scale))
        for policy, scale in (("lru", 1.0), ("wa", 1.1))
        for capacity in (400, 800)
    ]


@pytest.mark.parametrize(
    ("quantiles", "labels"),
    [
        # an unloaded fleet: it had symlog's linear part up to 2 s, labelled
        # -6.76857 x 10^-2 and 1.57865 x 10^0, and started below 0
        ([0.0065, 0.05, 0.3, 1.58], ["0", "0.001", "0.01", "0.1", "1", "10"]),
        ([0.011, 2.0, 30.0, 90.0], ["0", "0.01", "0.1", "1", "10", "100"]),
        ([0.0, 0.0, 0.00002, 0.0003, 0.004], ["0", "0.0001", "0.001", "0.01"]),
        ([0.0, 0.0], ["0", "1"]),
    ],
    ids=["unloaded", "loaded", "sub-ms-and-zeros", "all-zero"],
)
def test_the_qttft_cdf_axis_reads_from_0_over_every_decade_of_the_data(
    quantiles: list[float], labels: list[str]
) -> None:
    from controlplane.plots.simulate import simulation_figure

    fig = simulation_figure(sim_results(quantiles))
    cdf = fig.axes[0]
    fig.canvas.draw()
    left, right = cdf.get_xlim()
    assert cdf.get_xscale() == "symlog"
    assert left == 0 and right >= 1.1 * max(quantiles)
    shown = [t for t in cdf.get_xticklabels() if left <= t.get_position()[0] <= right]
    assert [t.get_text() for t in shown] == labels
