"""What the controller has said once: the keys of things logged the first time they come.

Owns ``ToldOnce``, the memory behind every "said once per key" of the control plane (an
unreadable heartbeat or ledger, a stream or worker left out past ``KVWISE_MAX_WORKERS``, a
failure of the shadow, by kind). It sits outside the layers, so that the service and the
shadow evaluation keep one copy. It must never log, nor decide what is said: its owner
asks ``first`` and says it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K")


class ToldOnce(Generic[K]):
    """Keys told, at most ``cap`` of them (None: no cap). Past the cap a new key is neither
    told nor remembered, so a flood of names floods neither the log nor the memory; a key
    forgotten (``forget``, ``keep_only``) is told again if it comes back."""

    def __init__(self, cap: int | None = None) -> None:
        self.cap = cap
        self._keys: set[K] = set()

    def first(self, key: K) -> bool:
        """Whether ``key`` is to be told now: True the first time it comes (it is then
        remembered), False while it is remembered or while the memory is full."""
        if key in self._keys or (self.cap is not None and len(self._keys) >= self.cap):
            return False
        self._keys.add(key)
        return True

    def forget(self, key: K) -> None:
        self._keys.discard(key)

    def keep_only(self, keys: Iterable[K]) -> None:
        """Forget every key not among ``keys`` (those gone: a worker expired)."""
        self._keys.intersection_update(keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._keys))

    def __len__(self) -> int:
        return len(self._keys)
