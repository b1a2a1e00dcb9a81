"""Policy parameters for tests: curves past the schema's checks, as parameters built in
code (``model_construct``) may be, which an evictor must refuse when it is given them."""

from __future__ import annotations

from agent.policy_document import BUILTIN_POLICY, CategoryParams


def unchecked(**params: float) -> CategoryParams:
    """The default curve but for ``params``, not validated."""
    return CategoryParams.model_construct(**{**BUILTIN_POLICY.default.model_dump(), **params})
