"""The refit-churn benchmark sorts each refit as the controller's rule does."""

from __future__ import annotations

from agent.policy_document import CategoryParams
from tests.bench.refit_churn import judge

A = CategoryParams(rate=0.1, p_reuse=0.5, life_s=30.0, samples=100, source="fit")


def params(**changes: float) -> CategoryParams:
    return A.model_copy(update=changes)


def test_nothing_fitted_is_no_fit() -> None:
    assert judge({"a": A}, {}, 0.05).kind == "no fit"


def test_a_category_the_document_lacks_is_new() -> None:
    assert judge({"a": A}, {"a": A, "b": A}, 0.05).kind == "new category"


def test_a_move_under_the_threshold_publishes_nothing() -> None:
    assert judge({"a": A}, {"a": params(rate=0.104)}, 0.05).kind == "unchanged"


def test_a_move_names_the_category_that_moved_most_and_weighs_by_accesses() -> None:
    fitted = {"a": params(rate=0.2, samples=100), "b": params(p_reuse=0.55, samples=300)}
    verdict = judge({"a": A, "b": A}, fitted, 0.05)
    assert verdict.kind == "moved"
    assert verdict.driver == "a"
    assert verdict.driver_had_new_accesses is False
    assert abs(verdict.weighted_change - (0.25 * 1.0 + 0.75 * 0.1)) < 1e-9
