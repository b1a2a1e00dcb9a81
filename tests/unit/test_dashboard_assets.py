"""The dashboard's static files: all shipped in the package, all local, all present.

The browser test (tests/e2e/test_dashboard.py) judges the page itself; this checks what a
wheel would carry and that no file points anywhere but the controller that serves it.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path, PurePosixPath

from controlplane.api.ui import STATIC_DIR
from tests.conftest import REPO

URL = re.compile(r"\b(?:https?:)?//[A-Za-z0-9.-]+\.[A-Za-z]{2,}")
# The SVG namespace is a name, not a place the browser goes.
NAMESPACES = {"http://www.w3.org/2000/svg"}


def _static_files() -> list[Path]:
    return sorted(p for p in STATIC_DIR.rglob("*") if p.is_file())


def _matches(rel: str, glob: str) -> bool:
    """Whether setuptools' package-data ``glob`` (no recursion) takes ``rel``."""
    path, pattern = PurePosixPath(rel), PurePosixPath(glob)
    return len(path.parts) == len(pattern.parts) and path.match(glob)


def test_every_static_file_is_package_data() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["controlplane"]
    files = _static_files()
    assert {p.suffix for p in files} >= {".html", ".css", ".js", ".svg"}
    for path in files:
        rel = path.relative_to(REPO / "controlplane").as_posix()
        assert any(_matches(rel, g) for g in globs), f"{rel} is not in package-data"


def test_nothing_points_off_the_controller() -> None:
    for path in _static_files():
        text = path.read_text()
        for name in NAMESPACES:
            text = text.replace(name, "")
        assert URL.findall(text) == [], f"{path.name} names another place"


def test_every_local_reference_exists() -> None:
    html = (STATIC_DIR / "index.html").read_text()
    refs = re.findall(r'(?:src|href)="([^"#]+)"', html)
    assert refs, "index.html references nothing"
    for ref in refs:
        assert (STATIC_DIR / ref).is_file(), f"index.html: {ref} is missing"
    for js in (STATIC_DIR / "js").glob("*.js"):
        for ref in re.findall(r'from "(\./[^"]+)"', js.read_text()):
            assert (js.parent / ref).is_file(), f"{js.name}: {ref} is missing"
