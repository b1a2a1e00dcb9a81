"""docs/architecture.md's tree agrees with the packages on disk and with the import-linter
layer contracts in pyproject.toml."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from tests.conftest import REPO

DOC = Path(REPO) / "docs" / "architecture.md"
ROOTS = ("agent", "controlplane")
ENTRY = re.compile(r"^( *)([a-z_]+(?:/|\.py))(?: |$)")


def doc_tree() -> list[str]:
    """The paths the tree block under "## The tree" names, in the order it names them."""
    text = DOC.read_text()
    block = text.split("## The tree", 1)[1].split("```", 2)[1]
    paths: list[str] = []
    parents: list[tuple[int, str]] = []
    for line in block.splitlines():
        match = ENTRY.match(line)
        if match is None:
            continue
        indent, name = len(match.group(1)), match.group(2)
        while parents and parents[-1][0] >= indent:
            parents.pop()
        path = "".join(p for _, p in parents) + name
        paths.append(path.rstrip("/"))
        if name.endswith("/"):
            parents.append((indent, name))
    return paths


def packages_on_disk() -> set[str]:
    """Every package, and every module at the top of a root (but dunder ones)."""
    packages = {
        init.parent.relative_to(REPO).as_posix()
        for root in ROOTS
        for init in (Path(REPO) / root).rglob("__init__.py")
    }
    modules = {
        module.relative_to(REPO).as_posix()
        for root in ROOTS
        for module in (Path(REPO) / root).glob("*.py")
        if not module.name.startswith("__")
    }
    return packages | modules


def test_tree_names_every_package_and_only_what_exists() -> None:
    named = doc_tree()
    left_out = sorted(packages_on_disk() - set(named))
    assert not left_out, f"the tree leaves out {left_out}"
    missing = [p for p in named if not (Path(REPO) / p).exists()]
    assert not missing, f"the tree names what is not on disk: {missing}"


def test_tree_lists_each_layer_contract_in_its_order() -> None:
    config = tomllib.loads((Path(REPO) / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    layered = [c for c in contracts if c["type"] == "layers"]
    assert {c["containers"][0] for c in layered} == set(ROOTS)
    named = doc_tree()
    for contract in layered:
        container = contract["containers"][0]
        position = {
            p.removeprefix(container + "/").removesuffix(".py"): i
            for i, p in enumerate(named)
            if p.startswith(container + "/")
        }
        order = []
        for layer in contract["layers"]:
            modules = [m.strip() for m in layer.split("|")]
            unnamed = [m for m in modules if m not in position]
            assert not unnamed, f"{container}: layer {layer!r} not in the tree"
            order.append(sorted(position[m] for m in modules))
        flat = [i for layer in order for i in layer]
        assert flat == sorted(flat), f"{container}: the tree's order is not {contract['layers']}"


NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight")


def test_the_prose_counts_the_agent_modules_outside_its_layers() -> None:
    config = tomllib.loads((Path(REPO) / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (agent_layers,) = [c["layers"] for c in contracts if c.get("containers") == ["agent"]]
    layered = {m.strip() for layer in agent_layers for m in layer.split("|")}
    modules = [p for p in doc_tree() if re.fullmatch(r"agent/[a-z_]+\.py", p)]
    outside = [p for p in modules if p.removeprefix("agent/").removesuffix(".py") not in layered]
    said = re.search(r"The agent's last (\w+) modules\s+sit outside", DOC.read_text())
    assert said is not None, "the prose no longer says how many modules sit outside"
    assert said.group(1).lower() == NUMBER_WORDS[len(outside)], outside
