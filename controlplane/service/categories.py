"""The categories as operators see them: each one's last fit beside its published
parameters (``GET /v1/categories``), and one's reuse-time CDF, empirical and fitted.

Owns ``CategorySummary`` and ``CategoryDetail`` and how they are read from the document in
force and the last fit (``summaries``, ``detail``). Pure over what it is given: it must
never read Redis or fit anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.policy_document import CategoryParams, PolicyDocument
from controlplane.fit import FitResult
from controlplane.fit.gof import ReuseCurve


@dataclass(frozen=True)
class CategorySummary:
    """One category as operators see it: the last fit beside the published parameters."""

    name: str
    samples: int
    fitted: CategoryParams | None
    published: CategoryParams | None
    published_version: int | None
    """The version in force, which holds ``published`` (None: it holds no such category)."""
    fit_quality: float | None


@dataclass(frozen=True)
class CategoryDetail(CategorySummary):
    """A summary with the empirical and fitted reuse-time CDF (None: no fit data)."""

    cdf: ReuseCurve | None


def summaries(current: PolicyDocument | None, fit: FitResult | None) -> list[CategorySummary]:
    """Every category published in ``current`` or fitted in ``fit``, by name."""
    names = set(current.categories if current else ()) | set(fit.categories if fit else ())
    return [_summary(n, current, fit) for n in sorted(names)]


def detail(
    name: str, current: PolicyDocument | None, fit: FitResult | None
) -> CategoryDetail | None:
    """Category ``name``'s summary and its CDF (None: neither published nor fitted)."""
    if (current is None or name not in current.categories) and (
        fit is None or name not in fit.categories
    ):
        return None
    curve = fit.cdf_points(name) if fit is not None else None
    return CategoryDetail(**vars(_summary(name, current, fit)), cdf=curve)


def _summary(name: str, current: PolicyDocument | None, fit: FitResult | None) -> CategorySummary:
    published = current.categories.get(name) if current else None
    fitted = fit.categories.get(name) if fit else None
    return CategorySummary(
        name=name,
        samples=fitted.samples if fitted else (published.samples if published else 0),
        fitted=fitted,
        published=published,
        published_version=current.version if current and published else None,
        fit_quality=fitted.fit_quality if fitted else None,
    )
