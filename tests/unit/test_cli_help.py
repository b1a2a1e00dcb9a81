"""Every command's ``--help`` and ``kvwise config`` at 80 columns: nothing cut, prose
reflowed rather than ragged, and ``kvwise --version``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib.metadata import version

import pytest
import typer
from typer.testing import CliRunner

from controlplane.cli import app, replay_cmd
from tests.conftest import REPO

WIDTH = 80


def command_paths() -> list[list[str]]:
    """Every command and group of the app, found by walking it (new commands included)."""
    paths: list[list[str]] = []

    def walk(command: object, path: list[str]) -> None:
        paths.append(path)
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return paths


def run(*args: str) -> str:
    res = CliRunner().invoke(app, list(args), env={"COLUMNS": str(WIDTH)})
    assert res.exit_code == 0, res.output
    return res.stdout


def prose_paragraphs(help_text: str) -> list[list[str]]:
    """The description above the option panels, as paragraphs of lines; example blocks
    (indented further than the prose) are left out."""
    head = help_text.split("╭")[0].splitlines()
    paragraphs: list[list[str]] = [[]]
    for line in head:
        text = line.rstrip()
        if not text:
            paragraphs.append([])
        elif not text.startswith("  ") and not text.lstrip().startswith("Usage:"):
            paragraphs[-1].append(text)
    return [p for p in paragraphs if p]


def test_the_walk_finds_every_command() -> None:
    found = {" ".join(p) for p in command_paths()}
    assert {"", "replay", "demo", "worker", "controller", "config", "trace stats"} <= found


@pytest.mark.parametrize("path", command_paths(), ids=lambda p: " ".join(p) or "kvwise")
def test_help_fits_80_columns_and_is_not_ragged(path: list[str]) -> None:
    out = run(*path, "--help")
    assert max(len(line.rstrip()) for line in out.splitlines()) <= WIDTH
    assert "…" not in out
    assert "[[" not in out, "a metavar carries its own brackets; click adds them"
    for paragraph in prose_paragraphs(out):
        # Every line but a paragraph's last is filled: nothing broke it early.
        for line in paragraph[:-1]:
            assert len(line) >= WIDTH - 22, (path, line)


@pytest.mark.parametrize("path", command_paths(), ids=lambda p: " ".join(p) or "kvwise")
def test_examples_are_code_blocks_so_no_command_is_reflowed(path: list[str]) -> None:
    # An example written as prose is wrapped at 80 columns and split mid-command.
    for paragraph in prose_paragraphs(run(*path, "--help")):
        assert not any(line.lstrip().startswith("kvwise ") for line in paragraph), paragraph


@pytest.mark.parametrize("path", command_paths(), ids=lambda p: " ".join(p) or "kvwise")
def test_examples_stand_one_blank_line_from_the_text(path: list[str]) -> None:
    """Rich padded each example block with a blank line of its own, beside the one
    between Markdown blocks: two blank lines above and below every "Examples:"."""
    lines = [line.strip() for line in run(*path, "--help").splitlines()]
    doubled = [i for i in range(1, len(lines)) if not lines[i - 1] and not lines[i]]
    assert doubled == [], lines


@pytest.mark.parametrize("path", command_paths(), ids=lambda p: " ".join(p) or "kvwise")
def test_the_root_and_every_command_and_group_show_examples(path: list[str]) -> None:
    """``kvwise``, ``demo``, ``controller`` and ``config`` showed none, nor did the
    ``trace`` and ``bench`` groups."""
    lines = [line.strip() for line in run(*path, "--help").splitlines()]
    heading = next(i for i, line in enumerate(lines) if line in ("Example:", "Examples:"))
    assert lines[heading + 2].split()[0].startswith(("kvwise", "KVWISE_")), lines


@pytest.mark.parametrize(
    ("path", "clock"),
    [(["demo"], "Wall-clock"), (["trace", "record"], "Wall-clock"), (["trace", "synth"], "Trace")],
)
def test_each_duration_says_which_clock_its_seconds_run_on(path: list[str], clock: str) -> None:
    """``demo --duration`` and ``trace record --duration`` are seconds of running, ``trace
    synth --duration`` seconds of trace time; their help said "Stop after this long" and
    "Seconds of trace"."""
    text = re.sub(r"[│\s]+", " ", run(*path, "--help"))
    said = text.split("--duration SECONDS ", 1)[1]
    assert said.startswith(f"{clock} seconds "), said[:80]


@pytest.mark.parametrize("path", command_paths(), ids=lambda p: " ".join(p) or "kvwise")
def test_dash_h_is_help(path: list[str]) -> None:
    """``kvwise -h`` said "No such option"."""
    assert run(*path, "-h") == run(*path, "--help")


@pytest.mark.parametrize("path", command_paths(), ids=lambda p: " ".join(p) or "kvwise")
def test_bounded_numbers_are_named_not_typed(path: list[str]) -> None:
    """``bench serve`` showed ``<int range> [x>=1]`` where the others show ``N [x>=1]``,
    squeezing its help column."""
    assert " range>" not in run(*path, "--help")


def test_version() -> None:
    assert run("--version").strip() == f"kvwise {version('kvwise')}"


def test_config_names_stay_whole_and_copyable_at_80_columns() -> None:
    out = run("config")
    assert max(len(line) for line in out.splitlines()) <= WIDTH
    assert [line for line in out.splitlines() if line != line.rstrip()] == []
    assert "…" not in out
    lines = out.splitlines()
    doc = json.loads(run("config", "--json"))
    for rows in doc.values():
        for row in rows:
            name, value = row["env"], row["value"]
            if value is None and row["default"] is None:
                want = f"{name}  (unset)"
            else:
                want = f"{name}={'none' if value is None else value}"
            assert want in lines, want


def test_config_prints_a_knob_set_to_none_as_it_is_set() -> None:
    """``KVWISE_LIFE_S_OVERRIDE=none`` printed as ``(unset)``, which means its default."""
    name = "KVWISE_LIFE_S_OVERRIDE"
    env = {"COLUMNS": str(WIDTH), name: "none"}
    out = CliRunner().invoke(app, ["config"], env=env).output
    line = next(line for line in out.splitlines() if line.startswith(name))
    assert line == f"{name}=none"
    copied = dict([line.split("=", 1)])  # the line, copied into a shell, means the same
    shown = CliRunner().invoke(app, ["config", "--json"], env=copied).output
    (row,) = [r for r in json.loads(shown)["controller"] if r["env"] == name]
    assert row["value"] is None and row["default"] is not None


def test_the_app_loads_without_scipy_or_the_shadow() -> None:
    """``kvwise --version`` took 3 s: the replay command's module loaded the policy
    catalogue (SciPy) and the shadow when the app was built. They load when it runs."""
    code = (
        "import sys; import controlplane.cli.root; "
        "print(sorted(m for m in ('scipy', 'controlplane.replay.catalog', "
        "'controlplane.shadow.auto_replay') if m in sys.modules))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert res.stdout.strip() == "[]"


def test_the_policies_replay_help_lists_are_the_catalogues() -> None:
    import controlplane.shadow.auto_replay  # noqa: F401  (registers auto)
    from controlplane.replay import catalog

    assert ", ".join(catalog.names()) == replay_cmd.KNOWN_POLICIES


def test_the_block_sizes_replay_help_gives_are_the_replays() -> None:
    from controlplane.replay.accesses import BLOCK_TOKENS

    bailian, mooncake = BLOCK_TOKENS["bailian"], BLOCK_TOKENS["mooncake"]
    said = replay_cmd.BLOCK_SIZES
    assert said == f"a block is {bailian} tokens in Bailian traces, {mooncake} in Mooncake's"
    assert set(BLOCK_TOKENS) == {"bailian", "mooncake"}


@pytest.mark.parametrize("path", command_paths(), ids=lambda p: " ".join(p) or "kvwise")
def test_flags_show_no_value_and_arguments_one_spelling(path: list[str]) -> None:
    """Typer showed ``--json <bool>`` (``--json true`` is refused) and a required argument
    as ``{TRACE}`` in the usage line beside an optional ``[TRACE]``."""
    text = run(*path, "--help")
    assert "<bool>" not in text
    usage = next(line for line in text.splitlines() if "Usage:" in line)
    assert "{" not in usage


@pytest.mark.parametrize("path", command_paths(), ids=lambda p: " ".join(p) or "kvwise")
def test_options_name_their_value_not_its_type(path: list[str]) -> None:
    """``--redis-url <str>``, ``--port <int>``: an option names what it takes (URL, PORT,
    NAME), as the bounded numbers do."""
    text = run(*path, "--help")
    assert "<str>" not in text and "<int>" not in text and "<float>" not in text


def test_controller_help_gives_each_options_default() -> None:
    """``kvwise controller --help`` gave neither the variable an option overrides nor the
    value it falls back to."""
    from controlplane.service.settings import ControllerSettings

    text = re.sub(r"[│\s]+", " ", run("controller", "--help"))
    for field in ("host", "port"):
        default = ControllerSettings.model_fields[field].default
        assert f"[default: KVWISE_{field.upper()}, else {default}]" in text, field
