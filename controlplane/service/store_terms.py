"""The policy store's terms: its default bounds, the errors its changes raise, what they
return, and the memory of it a replica keeps.

Owns the constants (``HISTORY_SIZE``, ``MAX_OVERRIDES``, ``MAX_FITTED_CATEGORIES``), the
errors (``TooManyOverrides``, ``LeaseLost``, ``PolicyLost``, ``RefitsHeld``) and the
values that cross from the store to its callers (``VersionInfo``, ``Change``,
``EvictorState``, ``StoreState``, ``Fence``, ``Remembers``). Plain values only: it must
never read or write Redis, nor compose a document.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

from agent.policy_document import EVICTOR_FAMILIES, EvictorFamily, PolicyDocument
from controlplane.service.stored_state import Base, StoreError

HISTORY_SIZE: Final = 100
"""Default count of the policy versions kept (the controller's ``history_size``)."""
MAX_OVERRIDES: Final = 256
"""Default bound of the overrides kept at once (a bound on every document's size)."""
MAX_FITTED_CATEGORIES: Final = 2048
"""Default bound of the categories a fit brings (the controller's ``max_categories``: its
statistics window holds no more)."""


class TooManyOverrides(StoreError):
    """A new pin past ``max_overrides`` (checked inside the publication's transaction, so
    concurrent pins cannot pass the limit together)."""


class LeaseLost(StoreError):
    """A publication refused by its fence: this replica no longer leads."""


class PolicyLost(RuntimeError):
    """A change refused while Redis has lost the policy state this replica remembers: the
    leader restores it first (``PolicyMemory``), and a change now would publish over it,
    numbered from nothing and without the overrides, pin and hold it holds."""


class RefitsHeld(RuntimeError):
    """A fit refused inside its transaction: refits are held (a rollback with ``hold``)."""


REFITS_HELD = "held: after a rollback; POST /v1/policy/refit"
"""Why an automatic refit publishes nothing while refits are held."""

Fence = Callable[[], bool]
"""Asked right before a publication's transaction: False refuses it (``LeaseLost``)."""


@dataclass(frozen=True)
class VersionInfo:
    version: int
    created_at: float
    note: str
    categories: int


@dataclass(frozen=True)
class Change:
    """What an operator's change did: the document in force after it, and whether it was
    published (False: the change was in force already; nothing written)."""

    document: PolicyDocument
    published: bool


@dataclass(frozen=True)
class EvictorState:
    """The evictor family: in force (the current document's), pinned by an operator
    (None: not pinned), selected by the controller (what applies when not pinned)."""

    in_force: EvictorFamily | None
    pinned: EvictorFamily | None
    selected: EvictorFamily
    families: tuple[str, ...] = EVICTOR_FAMILIES


@dataclass(frozen=True)
class StoreState:
    """Everything an operator or a fit put in the store, as one replica last read it: what
    ``restore`` writes back into a Redis that has lost it."""

    version: int
    """The version in force when read."""
    base: Base
    overrides: dict[str, dict[str, float]]
    pin: EvictorFamily | None
    held: bool

    def describe(self) -> str:
        """What it holds, for the note of the version that restores it."""
        parts = [f"v{self.version}'s fit", f"{len(self.overrides)} overrides"]
        if self.pin is not None:
            parts.append(f"evictor pinned to {self.pin}")
        if self.held:
            parts.append("refits held")
        return ", ".join(parts)


class Remembers(Protocol):
    """A replica's memory of the store (``PolicyMemory``), told each publication and asked
    before each: the state to restore once Redis has lost it, and the highest version
    number seen published (a number once published never names another document)."""

    @property
    def state(self) -> StoreState | None: ...

    @property
    def highest_version(self) -> int: ...

    def remember(self, state: StoreState) -> None: ...
