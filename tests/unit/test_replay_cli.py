"""``kvwise replay`` through the real Typer app: option checks, merged duplicates, progress
on stderr, and tables that stay whole at 80 columns."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from controlplane.cli import app
from controlplane.replay import catalog
from controlplane.replay.options import DEFAULT_OPTIONS
from controlplane.replay.runner import ReplayJob
from controlplane.traces.synth import synthesize
from controlplane.traces.writer import write_bailian

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "mooncake_synthetic.jsonl.gz"


@pytest.fixture(scope="module")
def toc_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two minutes of synthetic to-C traffic: several categories with long names."""
    path = tmp_path_factory.mktemp("replay") / "toc.jsonl"
    write_bailian(synthesize("to-c", duration_s=120, qps=4, seed=3), path)
    return path


def run(*args: str, columns: int = 80) -> tuple[int, str, str]:
    res = CliRunner().invoke(app, list(args), env={"COLUMNS": str(columns)})
    return res.exit_code, res.stdout, res.stderr


def test_help_lists_every_policy_and_fits_80_columns() -> None:
    code, out, _ = run("replay", "--help")
    assert code == 0
    flat = " ".join(out.split())
    for name in catalog.names():
        assert re.search(rf"\b{re.escape(name)}\b", flat), name
    assert max(len(line) for line in out.splitlines()) <= 80
    # Prose is reflowed, not cut where the docstring broke its lines.
    assert "blocks are released tail first" in flat


def test_duplicate_policies_and_capacities_are_merged() -> None:
    code, out, _ = run(
        "replay", str(SAMPLE), "-p", "lru,fifo,lru", "--capacity", "500,500,90", "--json"
    )
    assert code == 0
    runs = [(r["policy"], r["capacity"]) for r in json.loads(out)["results"]]
    assert runs == [("lru", 500), ("lru", 90), ("fifo", 500), ("fifo", 90)]


def test_fractions_that_round_to_one_size_are_one_run() -> None:
    code, out, _ = run(
        "replay", str(SAMPLE), "-p", "inf", "--capacity-frac", "0.1,0.10000001,0.2", "--json"
    )
    assert code == 0
    assert len(json.loads(out)["results"]) == 2


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["-j", "-3"], "error: --jobs: "),
        (["--split", "1.5"], "error: --split: must be in (0, 1), got 1.5"),
        (["--split", "0.3"], "--split applies only with --wa-fit split"),
        # auto's options, given with no auto to apply them to, are refused as --split is
        (["-p", "lru", "--auto-window", "10"], "error: --auto-window applies only when --policy"),
        (["-p", "wa", "--auto-rate=1", "--auto-margin=0"], "--auto-rate, --auto-margin apply"),
        (["-p", "wa", "--auto-supersede", "tree"], "--auto-supersede applies only when"),
        (["-p", "auto", "--auto-supersede", "chat"], "error: --auto-supersede: "),
        (["-p", "wa", "--auto-wa", "wa-shared"], "--auto-wa applies only when"),
        (["-p", "auto", "--auto-wa", "shared"], "error: --auto-wa: "),
        (
            ["-p", "auto", "--auto-wa", "wa-shared", "--auto-supersede", "tree"],
            "error: auto's wa-shared (--auto-wa wa-shared) does not run the superseded-branch",
        ),
        (["--refit-every", "0"], "error: --refit-every: "),
        (["--life", "-1"], "error: --life: "),
        (["--shrinkage", "-5"], "error: --shrinkage: "),
        (["-p", "lru", "--shrinkage", "50"], "error: --shrinkage applies only to the fitted"),
        (["--near-concurrent", "nan"], "error: --near-concurrent: "),
        (["--wa-fit", "twice"], "error: --wa-fit: "),
        (["-p", "lru,nope"], "--policy: unknown policy 'nope'"),
        # 'all' is a name the help offers: refused in a list as "unknown" with a list of
        # names that left it out
        (["-p", "all,lru"], "--policy: 'all' stands alone (every policy): give -p all"),
        # a name one letter off, or in capitals: the error says which name was meant
        (["-p", "lru,s3fif0"], "unknown policy 's3fif0' (did you mean 's3fifo'?); known: "),
        (["-p", "LRU"], "unknown policy 'LRU' (did you mean 'lru'?); known: "),
        (["--capacity", "5,x"], "--capacity: 'x' is not an integer"),
        (["--capacity", ""], "--capacity: empty list"),
        (["--capacity-frac", ""], "--capacity-frac: empty list"),
        (["--capacity", "99999999999999999999"], "99999999999999999999 is too large"),
        (["--capacity-frac", "1.5"], "--capacity-frac: 1.5 is not in (0, 1]"),
        (["--capacity", "5", "--capacity-frac", "0.1"], "not both"),
        (["--reuse-class", "hit", "--attribution", "creator"], "(--attribution last)"),
        # a fitted policy's options with none to apply them to changed nothing, silently
        (
            ["-p", "lru,s3fifo", "--reuse-class", "hit", "--life", "5"],
            "error: --life, --reuse-class apply only to the fitted policies (wa, wa-ref,",
        ),
        (["-p", "lru", "--refit-every", "5"], "--refit-every applies only to the fitted"),
    ],
)
def test_bad_options_exit_2_naming_the_option(args: list[str], says: str) -> None:
    code, out, err = run("replay", str(SAMPLE), *args)
    assert code == 2, out + err
    assert says in " ".join(err.split())
    for internal in ("refit_every_s", "life_s", "near_concurrent_s", "shrinkage_samples"):
        assert internal not in err
    assert "Traceback" not in err


def test_reuse_classes_by_hit_run_with_every_policy() -> None:
    """``wa-ref`` attributes blocks to their creator, so it runs without the classes; the
    rest file by them (the default policy list names it)."""
    code, out, err = run("replay", str(SAMPLE), "--reuse-class", "hit", "--capacity", "64")
    assert code == 0, err
    assert "wa-ref" in out and "Traceback" not in err


def test_empty_trace_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code, _, err = run("replay", str(empty), "-p", "lru", "--capacity", "4")
    assert code == 2 and "no requests" in err


def test_each_finished_run_is_reported_on_stderr_when_not_a_terminal() -> None:
    code, out, err = run("replay", str(SAMPLE), "-p", "lru,fifo", "--capacity", "300,600")
    assert code == 0
    lines = [line for line in err.splitlines() if line.startswith("replay: ")]
    # Runs finish in any order when they go to several processes.
    runs = {line.split(" done (")[0] for line in lines}
    assert runs == {f"replay: {p} at {c} blocks" for p in ("lru", "fifo") for c in (300, 600)}
    assert [line.split(" done (")[1].split(" ")[0] for line in lines] == [
        "1/4",
        "2/4",
        "3/4",
        "4/4",
    ]
    assert "replay:" not in out


def test_json_mode_keeps_stderr_quiet() -> None:
    code, out, err = run("replay", str(SAMPLE), "-p", "lru", "--capacity", "300", "--json")
    assert code == 0 and json.loads(out)["results"] and err == ""


def test_the_docs_json_example_has_every_key_the_command_prints() -> None:
    """docs/replay.md's ``--json`` example under "Output" has every top-level key and
    every key of a run (it once left ``options`` and ``scored`` out)."""
    code, out, _ = run("replay", str(SAMPLE), "-p", "lru", "--capacity", "300", "--json")
    assert code == 0
    doc = json.loads(out)
    text = (Path(__file__).resolve().parents[2] / "docs" / "replay.md").read_text()
    example = text.split("## Output")[1].split("```json")[1].split("```")[0]
    keys = [*doc, *doc["scored"], *doc["results"][0]]
    assert [k for k in keys if f'"{k}"' not in example] == []


def test_json_after_an_interrupt_gives_the_finished_runs_and_names_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real Ctrl-C (SIGINT to this process, as a terminal sends it) the moment the first
    of four runs on two workers is done: its result is in the JSON, the runs cut in
    ``not_finished``, and the exit code is 130."""
    from controlplane.cli.progress import MatrixProgress

    said_done = MatrixProgress.finish

    def finish_then_interrupt(self: MatrixProgress, job: ReplayJob) -> None:
        said_done(self, job)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(MatrixProgress, "finish", finish_then_interrupt)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # CI ignores it
    try:
        args = ["-p", "lru,fifo", "--capacity", "300,600", "-j", "2", "--json"]
        code, out, err = run("replay", str(SAMPLE), *args)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == 130, err
    doc = json.loads(out)
    done = {(r["policy"], r["capacity"]) for r in doc["results"]}
    cut = {(r["policy"], r["capacity"]) for r in doc["not_finished"]}
    assert done and cut and not done & cut
    assert done | cut == {(p, c) for p in ("lru", "fifo") for c in (300, 600)}
    assert f"replay: interrupted after {len(done)}/4 runs done; not finished: " in err


def test_tables_stay_whole_at_80_columns(toc_file: Path) -> None:
    names = [n for n in catalog.names() if n != "wa-ref"]
    caps = ["100", "200", "400", "800", "1600", "3200"]
    args = ["replay", str(toc_file), "-p", ",".join(names), "--capacity", ",".join(caps)]
    code, out, _ = run(*args, "--top-categories", "100")
    assert code == 0
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out
    code, doc, _ = run(*args, "--json")
    # Every hit ratio the JSON has is printed in full, per policy, capacity and category.
    for result in json.loads(doc)["results"]:
        assert f"{result['hit_ratio']:.4f}" in out
        for cat in result["per_category"].values():
            assert f"{cat['hit_ratio']:.3f}" in out
    for name in names:
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", out), name


def test_a_one_category_trace_hints_at_inferred_categories() -> None:
    """Only to a fitted policy, which would see one category (``lru`` sees none)."""
    code, _, err = run("replay", str(SAMPLE), "-p", "lru", "--capacity", "300")
    assert code == 0 and "--categories auto infers them" not in err
    code, _, err = run("replay", str(SAMPLE), "-p", "lru,wa", "--capacity", "300")
    assert code == 0 and "--categories auto infers them" in err
    assert all(len(line) <= 80 for line in err.splitlines())
    args = ("-p", "lru,wa", "--capacity", "300", "--categories", "auto")
    code, _, err = run("replay", str(SAMPLE), *args)
    assert code == 0 and "--categories auto infers" not in err


def test_per_category_results_are_by_the_categories_the_policies_saw() -> None:
    """With ``--categories auto`` the per-category results are by inferred category."""
    args = ("-p", "lru", "--capacity", "300", "--json")
    _, labelled, _ = run("replay", str(SAMPLE), *args)
    _, inferred, _ = run("replay", str(SAMPLE), *args, "--categories", "auto")
    by_label = json.loads(labelled)["results"][0]["per_category"]
    by_inferred = json.loads(inferred)["results"][0]["per_category"]
    assert list(by_label) == ["unknown"]
    assert len(by_inferred) > 1 and all(name.startswith("t") for name in by_inferred)
    total = sum(c["accesses"] for c in by_inferred.values())
    assert total == by_label["unknown"]["accesses"]


def test_a_cache_that_holds_the_whole_trace_is_said_to_evict_nothing() -> None:
    """The sample has fewer unique blocks than 1,000,000: that size ties every policy."""
    code, _, err = run("replay", str(SAMPLE), "-p", "lru,wa", "--capacity", "300,1000000")
    assert code == 0
    assert "note: a cache of 1,000,000 blocks holds all" in err
    assert "cache of 300" not in err and "300," not in err.split("note:")[1]
    code, _, err = run("replay", str(SAMPLE), "-p", "lru,wa", "--capacity", "300")
    assert code == 0 and "holds all" not in err


@pytest.mark.parametrize("columns", [60, 80])
def test_auto_notes_wrap_between_words_with_a_hanging_indent(columns: int) -> None:
    """At 80 columns the note under the table ("auto at 500 blocks: at 900 s ...: switch
    to s3fifo: ...") broke mid-sentence onto a line that read as a new note."""
    args = ("-p", "lru,auto", "--capacity", "500", "--top-categories", "0")
    code, out, _ = run("replay", str(SAMPLE), *args, columns=columns)
    assert code == 0
    lines = out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("auto at 500 blocks: "))
    note = lines[first:]
    assert len(note) > 1 and all(line.startswith("  ") for line in note[1:]), note
    assert max(len(line.rstrip()) for line in note) <= columns


def test_every_auto_option_of_the_replay_can_be_given() -> None:
    """``auto_min_accesses`` (the sampled accesses a window needs to count) was in the
    JSON options with no option to set it. Each option given reaches the options; none
    given, they are the defaults."""
    args = ("-p", "lru,auto", "--capacity", "300", "--json")
    given = {
        "--auto-rate": ("auto_rate", "0.5", 0.5),
        "--auto-window": ("auto_window_s", "30", 30.0),
        "--auto-windows": ("auto_windows", "2", 2),
        "--auto-margin": ("auto_margin", "0.05", 0.05),
        "--auto-min-accesses": ("auto_min_accesses", "0", 0),
        "--auto-supersede": ("auto_supersede", "tree", "tree"),
    }
    options = [arg for option, (_, text, _) in given.items() for arg in (option, text)]
    code, out, err = run("replay", str(SAMPLE), *args, *options)
    assert code == 0, err
    doc = json.loads(out)["options"]
    assert {field: doc[field] for field, _, _ in given.values()} == {
        field: value for field, _, value in given.values()
    }
    code, out, err = run("replay", str(SAMPLE), "-p", "lru", "--capacity", "300", "--json")
    assert code == 0, err
    doc = json.loads(out)["options"]
    assert {field: doc[field] for field, _, _ in given.values()} == {
        field: getattr(DEFAULT_OPTIONS, field) for field, _, _ in given.values()
    }
    code, _, err = run("replay", str(SAMPLE), *args, "--auto-min-accesses", "-1")
    assert code == 2 and "--auto-min-accesses" in err


def test_auto_can_serve_wa_shared() -> None:
    """``--auto-wa wa-shared``: auto's wa family is wa-shared; staying with it (no window
    judged on so short a trace), it hits as wa-shared does."""
    args = ("-p", "wa-shared,auto", "--capacity", "300", "--json", "--auto-wa", "wa-shared")
    code, out, err = run("replay", str(SAMPLE), *args)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["options"]["auto_wa"] == "wa-shared"
    hits = {result["policy"]: result["hits"] for result in doc["results"]}
    assert hits["auto"] == hits["wa-shared"] > 0


def test_a_note_every_run_gives_is_said_once_naming_the_runs() -> None:
    """A trace shorter than one refit period gave each fitted policy at each size the same
    three-line note, one after another: 24 of them for the default policies and sizes."""
    args = ("-p", "lru,wa,wa-ref", "--capacity", "300,500", "--refit-every", "1000000")
    code, out, _ = run("replay", str(SAMPLE), *args, "--top-categories", "0")
    assert code == 0
    assert out.count("no refit published a policy") == 1
    assert "\nwa, wa-ref at every size: no refit published a policy" in out
    code, out, _ = run("replay", str(SAMPLE), *args[:2], "--capacity", "300", *args[4:])
    assert code == 0 and "\nwa, wa-ref at 300 blocks: no refit published" in out
