"""A run's summary and the comparison of two: ``summarize``, ``compare`` (with the
intervals of ``paired`` where both summaries keep per-request figures and both runs sent
the same requests: ``config_differences`` over ``PAIRED_CONFIG``).

Owns the definitions. The hit ratio is cached prompt tokens over prompt tokens, both as the
server reports them per request (``usage``), over the requests that finished; vLLM's own
counters (``vllm:prefix_cache_hits`` over ``..._queries``) count the same tokens, so on a
server that serves nothing else the two agree. TTFT runs from sending a request to the
first streamed chunk with a choice, latency to the end of its stream; both include the
client's own queueing only after the request was sent (the wait for a concurrency slot is
``queue_wait_s``). Quantiles use numpy's ``inverted_cdf`` (observed values). It must never
do I/O; the CLI renders what this returns.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from controlplane.loadgen.client import RequestResult
from controlplane.loadgen.paired import change_intervals, per_request
from controlplane.loadgen.runner import BenchRun

SUMMARY_SCHEMA = 1
"""Version of the summary's layout (``--compare`` refuses other versions)."""
TOP_ERRORS = 5
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


def distribution(values: Sequence[float]) -> dict[str, float] | None:
    """Count, mean, p50/p90/p99 and max of ``values`` (None when empty)."""
    if not values:
        return None
    arr = np.asarray(values, dtype=np.float64)
    q = np.quantile(arr, list(QUANTILES.values()), method="inverted_cdf")
    out = {"count": float(len(arr)), "mean": float(arr.mean())}
    out.update({name: float(v) for name, v in zip(QUANTILES, q, strict=True)})
    out["max"] = float(arr.max())
    return out


def request_line(result: RequestResult) -> dict[str, Any]:
    """One request as a JSON-ready dict (the per-request JSON lines)."""
    line = asdict(result)
    line["ok"] = result.ok
    return line


def summarize(run: BenchRun, config: dict[str, Any]) -> dict[str, Any]:
    """The run's summary: counts, hit ratios, TTFT and latency, the server's counters."""
    done = [r for r in run.results if r.ok]
    reported = [r for r in done if r.cached_tokens is not None and r.prompt_tokens is not None]
    prompt_tokens = sum(r.prompt_tokens or 0 for r in reported)
    cached_tokens = sum(r.cached_tokens or 0 for r in reported)
    errors = Counter(r.error for r in run.results if r.error is not None)
    completion_tokens = sum(r.completion_tokens or 0 for r in done)
    return {
        "schema": SUMMARY_SCHEMA,
        "config": config,
        "started_at": run.started_at,
        "wall_s": run.wall_s,
        "requests": len(run.results),
        "ok": len(done),
        "errors": sum(errors.values()),
        "top_errors": [{"error": e, "count": n} for e, n in errors.most_common(TOP_ERRORS)],
        "cut_requests": sum(1 for r in run.results if r.cut_blocks),
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached_tokens,
        "hit_ratio": cached_tokens / prompt_tokens if reported and prompt_tokens else None,
        "cached_tokens_reported": len(reported),
        "output_tokens_per_s": completion_tokens / run.wall_s if run.wall_s > 0 else None,
        "ttft_s": distribution([r.ttft_s for r in done if r.ttft_s is not None]),
        "latency_s": distribution([r.latency_s for r in done if r.latency_s is not None]),
        "queue_wait_s": distribution([max(r.sent_s - r.scheduled_s, 0.0) for r in run.results]),
        "server": _server_counters(run),
        "kvwise": None,
        "per_request": per_request(run.results),
    }


def _server_counters(run: BenchRun) -> dict[str, Any] | None:
    """The server's counters over the run; None when it exports none, and every figure
    None with the reason as ``error`` when they could not be read after the run."""
    server = run.server_counters
    if server is not None:
        return {
            "prefix_cache_hits": server.hits,
            "prefix_cache_queries": server.queries,
            "hit_ratio": server.hit_ratio,
        }
    if run.counters_error is None:
        return None
    return dict.fromkeys(("prefix_cache_hits", "prefix_cache_queries", "hit_ratio")) | {
        "error": run.counters_error
    }


COMPARED: tuple[tuple[str, str, str], ...] = (
    ("requests", "requests", ""),
    ("errors", "errors", ""),
    ("hit ratio (cached)", "hit_ratio", "ratio"),
    ("hit ratio (server)", "server.hit_ratio", "ratio"),
    ("TTFT mean", "ttft_s.mean", "s"),
    ("TTFT p50", "ttft_s.p50", "s"),
    ("TTFT p90", "ttft_s.p90", "s"),
    ("TTFT p99", "ttft_s.p99", "s"),
    ("latency mean", "latency_s.mean", "s"),
    ("latency p50", "latency_s.p50", "s"),
    ("latency p90", "latency_s.p90", "s"),
    ("latency p99", "latency_s.p99", "s"),
    ("queue wait p90", "queue_wait_s.p90", "s"),
    ("output tokens/s", "output_tokens_per_s", ""),
    ("wall time", "wall_s", "s"),
)
"""Rows of ``compare``: label, dotted path into a summary, unit (``s``, ``ratio`` or a
count). A label is at most 18 characters: the table, with its interval column, then fits
80 columns without breaking a row."""


PAIRED_CONFIG: tuple[str, ...] = (
    "trace_digest",
    "limit",
    "max_blocks",
    "max_tokens",
    "categories",
    "block_tokens",
    "speed",
    "concurrency",
)
"""The ``config`` fields that say which requests a run sent, how long and when: two runs
are paired request by request only where all of these agree (the trace's requests, the
slice, the prompts' and answers' lengths, the categories sent, the send times and the
client's slots). A summary without ``trace_digest`` (written before it) names its trace by
``trace``, the path it was given."""
UNPAIRED_CONFIG: tuple[str, ...] = ("url", "model", "controller", "salt", "vocab", "timeout")
"""The ``config`` fields two paired runs may differ in: the server, its model and the
controller are what an A/B compares; ``salt`` is fresh for each run so that none inherits
another's cache, and with ``vocab`` it picks the token ids, never how many or which are
shared; ``timeout`` decides which requests finish, and only requests both finished are
paired. ``trace`` (the path) is the trace's name only: ``trace_digest`` is its content."""


class NotPaired(ValueError):
    """Two summaries whose runs did not send the same requests, compared paired."""


def config_differences(a: dict[str, Any], b: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """By field of ``PAIRED_CONFIG``, the values of two summaries' ``config`` that differ
    (a field one of them lacks is None there)."""
    config_a, config_b = (_config(s) for s in (a, b))
    fields = PAIRED_CONFIG
    if "trace_digest" not in config_a or "trace_digest" not in config_b:
        fields = ("trace", *PAIRED_CONFIG[1:])
    return {
        field: (config_a.get(field), config_b.get(field))
        for field in fields
        if config_a.get(field) != config_b.get(field)
    }


def _config(summary: dict[str, Any]) -> dict[str, Any]:
    config = summary.get("config")
    return config if isinstance(config, dict) else {}


def differences_text(differences: dict[str, tuple[Any, Any]]) -> str:
    """``field A vs B, ...``, each value as JSON writes it."""
    return ", ".join(
        f"{field} {json.dumps(a)} vs {json.dumps(b)}" for field, (a, b) in differences.items()
    )


def compare(
    a: dict[str, Any],
    b: dict[str, Any],
    names: tuple[str, str] = ("A", "B"),
    paired: bool = True,
) -> list[dict[str, Any]]:
    """Rows ``{metric, key, unit, a, b, change, interval}``; ``change`` is ``(b - a) / a``
    (None when either is missing or ``a`` is 0), ``interval`` its 95 % interval from the
    requests both runs finished (``paired``; None for the rows it is not drawn for, or
    when a summary kept no per-request figures). ``names`` name the runs in errors. Runs
    whose ``config_differences`` are not empty raise ``NotPaired``; with ``paired`` False
    they are compared without intervals."""
    _check_summaries(a, b, names)
    differences = config_differences(a, b)
    if paired and differences:
        raise NotPaired(
            f"{names[0]} and {names[1]} did not send the same requests "
            f"({differences_text(differences)}), so no request pairs with another"
        )
    intervals = change_intervals(a.get("per_request"), b.get("per_request")) if paired else {}
    rows = []
    for label, key, unit in COMPARED:
        va, vb = _dig(a, key), _dig(b, key)
        change = (vb - va) / va if va is not None and vb is not None and va != 0 else None
        interval = intervals.get(key) if change is not None else None
        rows.append(
            {"metric": label, "key": key, "unit": unit, "a": va, "b": vb, "change": change}
            | {"interval": None if interval is None else list(interval)}
        )
    return rows


def _check_summaries(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str]) -> None:
    """Refuse what is not a bench summary of this schema, or holds a non-finite number."""
    for name, summary in zip(names, (a, b), strict=True):
        if summary.get("schema") != SUMMARY_SCHEMA:
            raise ValueError(_not_a_summary(name, summary))
        bad = _non_finite(summary)
        if bad is not None:  # Python's JSON reads NaN and Infinity: a hand-written file
            raise ValueError(f"{name}: field {bad[0]!r} is {bad[1]}, not a finite number")


def _not_a_summary(name: str, found: dict[str, Any]) -> str:
    """Why ``found`` is refused as a summary: what it lacks, and what was expected."""
    expected = (
        f'a bench summary of schema {SUMMARY_SCHEMA} (the JSON object with "schema": '
        f"{SUMMARY_SCHEMA} that `kvwise bench serve -o FILE` writes)"
    )
    if "schema" not in found:
        return f'{name} is not a bench summary: it has no "schema" field; expected {expected}'
    said = json.dumps(found["schema"])
    said = said if len(said) <= 40 else said[:40] + "..."
    return f'{name} has "schema": {said}; expected {expected}'


def _non_finite(value: Any, where: str = "") -> tuple[str, float] | None:
    """The dotted path and value of the first number in ``value`` that is not finite."""
    if isinstance(value, float):
        return None if np.isfinite(value) else (where, value)
    if isinstance(value, dict):
        items: Any = ((f"{where}.{k}" if where else str(k), v) for k, v in value.items())
    elif isinstance(value, list):
        if all(type(v) is int for v in value):
            return None  # the per-request index and token lists: nothing to walk
        items = ((f"{where}[{n}]", v) for n, v in enumerate(value))
    else:
        return None
    for path, item in items:
        found = _non_finite(item, path)
        if found is not None:
            return found
    return None


def _dig(summary: dict[str, Any], dotted: str) -> float | None:
    value: Any = summary
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
