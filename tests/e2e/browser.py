"""Headless Chromium for page tests, driven by Selenium through Debian's chromedriver.

Owns finding the browser (``KVWISE_TEST_CHROMIUM`` / ``KVWISE_TEST_CHROMEDRIVER``, else
``/usr/bin/chromium`` and ``/usr/bin/chromedriver``: ``.ci/install_browser.sh`` installs
both), starting it isolated (fresh profile, no network of its own: no updates, sync or
QUIC), and the checks every page test makes in the page itself: console entries, layout
overflow, accessible names and text contrast. Nothing here downloads a browser or driver.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)


def _found(env: str, default: str) -> str | None:
    path = os.environ.get(env) or shutil.which(Path(default).name) or default
    return path if Path(path).is_file() else None


def require_chromium() -> tuple[str, str]:
    """Paths of chromium and chromedriver, or skip the test saying what is missing."""
    pytest.importorskip("selenium", reason="selenium is not installed (pip install -e '.[test]')")
    browser = _found("KVWISE_TEST_CHROMIUM", "/usr/bin/chromium")
    driver = _found("KVWISE_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")
    missing = [n for n, p in (("chromium", browser), ("chromedriver", driver)) if p is None]
    if missing or browser is None or driver is None:
        pytest.skip(
            f"{' and '.join(missing)} not found: run .ci/install_browser.sh (Debian's chromium "
            "and chromium-driver) or set KVWISE_TEST_CHROMIUM / KVWISE_TEST_CHROMEDRIVER"
        )
    return browser, driver


@contextmanager
def chromium(profile_dir: Path, width: int = 1366, height: int = 900) -> Iterator[Any]:
    """A headless Chromium (a Selenium ``WebDriver``) with a fresh profile; quits on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver_path = require_chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    profile = f"--user-data-dir={profile_dir}"
    for flag in (*CHROMIUM_FLAGS, profile, f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def console_problems(driver: Any) -> list[str]:
    """Console entries of level WARNING or SEVERE since the last call (reading drains them)."""
    return [
        f"{e['level']}: {e['message']}"
        for e in driver.get_log("browser")
        if e["level"] in ("WARNING", "SEVERE")
    ]


def emulate_zoom(driver: Any, device_width: int, device_height: int, zoom: float) -> None:
    """What the browser's zoom does: a layout viewport of ``device / zoom`` CSS pixels drawn
    at ``zoom`` device pixels per CSS pixel."""
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {
            "width": round(device_width / zoom),
            "height": round(device_height / zoom),
            "deviceScaleFactor": zoom,
            "mobile": False,
        },
    )


def clear_emulation(driver: Any) -> None:
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


# Runs in the page: what overflows the viewport sideways, and by how much.
OVERFLOW_JS = """
const doc = document.documentElement;
const out = [];
if (doc.scrollWidth > doc.clientWidth) out.push(`page: ${doc.scrollWidth} > ${doc.clientWidth}`);
for (const e of document.querySelectorAll('main > section, header')) {
  const r = e.getBoundingClientRect();
  if (r.right > doc.clientWidth + 1) out.push(`${e.id || e.tagName}: right edge ${r.right}`);
}
return out;
"""

# Runs in the page: controls without an accessible name, charts without a text alternative.
NAMES_JS = """
const out = [];
const visible = (e) => e.getClientRects().length > 0;
for (const e of document.querySelectorAll('input, select, textarea')) {
  if (e.type === 'hidden') continue;
  const labelled = (e.labels && e.labels.length) || e.getAttribute('aria-label');
  if (!labelled) out.push(`unlabelled ${e.tagName} #${e.id}`);
}
for (const e of document.querySelectorAll('button, a[href]')) {
  const name = (e.getAttribute('aria-label') || e.textContent || '').trim();
  if (!name && visible(e)) out.push(`nameless ${e.tagName} ${e.outerHTML.slice(0, 80)}`);
}
for (const s of document.querySelectorAll('svg[role="img"]')) {
  const ids = (s.getAttribute('aria-labelledby') || '').split(/\\s+/).filter(Boolean);
  const text = ids.map((i) => (document.getElementById(i) || {}).textContent || '')
    .join(' ').trim();
  if (!text) out.push('chart without a text alternative');
}
for (const t of document.querySelectorAll('table')) {
  if (!t.querySelector('caption') || !t.querySelector('th[scope]')) {
    out.push(`table without caption or header scope: ${t.id}`);
  }
}
return out;
"""

# Runs in the page: visible text below WCAG AA contrast (4.5:1, 3:1 for large text) against
# the first opaque background behind it.
CONTRAST_JS = """
const parse = (c) => {
  const m = /rgba?\\(([^)]+)\\)/.exec(c || '');
  if (!m) return null;
  const p = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number);
  return { rgb: p.slice(0, 3), a: p.length > 3 ? p[3] : 1 };
};
const lum = (rgb) => {
  const [r, g, b] = rgb.map((v) => {
    v /= 255;
    return v <= 0.04045 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
  });
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
};
const background = (e) => {
  for (let n = e; n; n = n.parentElement) {
    const c = parse(getComputedStyle(n).backgroundColor);
    if (c && c.a >= 0.5) return c.rgb;
  }
  return [255, 255, 255];
};
const out = [];
const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
let checked = 0;
while (walker.nextNode()) {
  const node = walker.currentNode;
  const e = node.parentElement;
  if (!node.textContent.trim() || !e || !e.getClientRects().length) continue;
  if (e.closest('.visually-hidden, .skip, title, desc, option, dialog:not([open])')) continue;
  const cs = getComputedStyle(e);
  if (cs.visibility !== 'visible' || Number(cs.opacity) === 0) continue;
  const fg = parse(e instanceof SVGElement ? cs.fill : cs.color);
  if (!fg) continue;
  const [l1, l2] = [lum(fg.rgb), lum(background(e))].sort((a, b) => b - a);
  const ratio = (l1 + 0.05) / (l2 + 0.05);
  const size = parseFloat(cs.fontSize);
  const large = size >= 24 || (size >= 18.66 && Number(cs.fontWeight) >= 700);
  checked++;
  if (ratio < (large ? 3 : 4.5)) {
    out.push(`${ratio.toFixed(2)}:1 "${node.textContent.trim().slice(0, 40)}"`);
  }
}
return { checked, failures: out.slice(0, 20) };
"""
