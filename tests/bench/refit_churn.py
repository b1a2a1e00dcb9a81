"""How often an online refit publishes a new policy version, and why.

On synthetic to-C and to-B traces (``controlplane.traces.synth``: synthetic, calibrated to
the paper's workloads) and the bundled Mooncake sample (categories inferred), it runs the
controller's refit rule as ``kvwise replay`` runs it (``CensoredRefitter``: a sliding
window, ``fit_all``, no version unless some category is new or some fitted parameter moved
by ``change_threshold``) every ``--refit-every`` trace seconds, and sorts each refit by what
it did: nothing to fit yet, a new category, a parameter moved, or unchanged. For the moves
it also reports the category that moved most (did it have new accesses since the last
publication?) and the change weighted by each category's accesses, a figure an operator
can set beside ``change_threshold``. No cache is replayed: a refit reads the trace's
accesses, whatever a cache held. It measures only; it changes no setting.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from agent.policy_document import CategoryParams
from controlplane.fit.per_category import max_relative_change, relative_change
from controlplane.replay.online import CensoredRefitter, FittedSetup
from controlplane.replay.options import ReplayOptions
from controlplane.traces.model import Trace
from tests.bench.ablation import headline, report_traces, synthetic_trace_parser


@dataclass(frozen=True)
class RefitVerdict:
    """What one refit did, and for a move, which category moved most."""

    kind: str
    """``no fit``, ``new category``, ``moved`` or ``unchanged``."""
    driver: str = ""
    driver_had_new_accesses: bool = True
    weighted_change: float = 0.0


def judge(
    published: Mapping[str, CategoryParams],
    fitted: Mapping[str, CategoryParams],
    threshold: float,
) -> RefitVerdict:
    """What the rule makes of ``fitted`` against the last ``published`` categories."""
    if not fitted:
        return RefitVerdict("no fit")
    if any(name not in published for name in fitted):
        return RefitVerdict("new category")
    if max_relative_change(published, fitted) < threshold:
        return RefitVerdict("unchanged")
    changes = {name: relative_change(published[name], p) for name, p in fitted.items()}
    driver = max(changes, key=changes.__getitem__)
    total = sum(p.samples for p in fitted.values()) or 1
    weighted = sum(fitted[n].samples / total * c for n, c in changes.items())
    return RefitVerdict(
        "moved", driver, fitted[driver].samples != published[driver].samples, weighted
    )


def verdicts(trace: Trace, options: ReplayOptions) -> list[RefitVerdict]:
    """Every refit of an online replay of ``trace``, judged (``judge``)."""
    setup = FittedSetup.of("wa", trace, options, None, capacity=1)
    refitter = setup.refitter(setup.names)
    assert isinstance(refitter, CensoredRefitter)
    threshold = refitter.settings.change_threshold
    times, offsets = setup.times, setup.offsets
    published: dict[str, CategoryParams] = {}
    out: list[RefitVerdict] = []
    done, due = 0, times[0] + options.refit_every_s
    for request, t in enumerate(times):
        if t < due:
            continue
        refitter.ingest(setup.cols, slice(done, offsets[request]))
        done = offsets[request]
        fitted = refitter.fit(t)
        categories = fitted[1].fitted if fitted is not None else {}
        verdict = judge(published, categories, threshold)
        out.append(verdict)
        if verdict.kind in ("new category", "moved"):
            published = dict(categories)
            assert fitted is not None and refitter.document_of(fitted[1], t, len(out))
        due = times[0] + (int((t - times[0]) // options.refit_every_s) + 1) * (
            options.refit_every_s
        )
    return out


def report(found: Sequence[RefitVerdict]) -> str:
    """The counts of each kind, then the moves' drivers and weighted changes."""
    kinds = Counter(v.kind for v in found)
    published = kinds["new category"] + kinds["moved"]
    lines = [f"{len(found)} refits, {published} published"]
    lines += [f"  {kind:<13} {kinds[kind]:>5}" for kind in ("new category", "moved", "unchanged")]
    lines.append(f"  {'no fit':<13} {kinds['no fit']:>5}")
    moves = [v for v in found if v.kind == "moved"]
    if moves:
        quiet = sum(not v.driver_had_new_accesses for v in moves)
        weighted = sorted(v.weighted_change for v in moves)
        lines.append(
            f"moves whose largest change was in a category with no new accesses: "
            f"{quiet} of {len(moves)}"
        )
        lines.append(
            "access-weighted change of a move: median "
            f"{statistics.median(weighted):.3f}, least {weighted[0]:.3f}, "
            f"most {weighted[-1]:.3f}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    ap = synthetic_trace_parser(__doc__, seed=7)
    ap.add_argument("--profiles", default="to-c,to-b")
    ap.add_argument("--mooncake", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--refit-every", type=float, default=60.0, help="trace seconds")
    args = ap.parse_args(argv)
    defaults = replace(ReplayOptions(), refit_every_s=args.refit_every)
    traces = report_traces(args, defaults)
    for trace, options in traces:
        print(headline(trace))
        print(report(verdicts(trace, options)), flush=True)
    print(f"seed {args.seed}, {args.duration:.0f} s at {args.qps} QPS", file=sys.stderr)


if __name__ == "__main__":
    main()
