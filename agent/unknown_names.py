"""How an unknown name is told: the one wording of every name check, the agent's evictor,
the CLI's policies, routers and profiles, and ``KVWISE_*`` variables that nothing reads.

Owns the message (``unknown policy 'LRU' (did you mean 'lru'?); known: lru, ...``, ``KVWISE_X
is not a kvwise setting: ...``) and the one rule for the known name a slip was surely meant
as (``meant``). It must never import the rest of the agent or do I/O: the agent and the
control plane both use it.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Final

ALIKE: Final = 0.8
"""How alike (difflib's ratio) a slip must be to a known name to be taken as meant for it."""
VARIABLE_ALIKE: Final = 0.82
"""``ALIKE`` for ``KVWISE_*`` variable names: every one shares the seven letters of the
prefix, which lift every ratio (``KVWISE_REDIS_HOST`` is 0.81 alike to
``KVWISE_REDIS_CLUSTER``)."""


def unknown_name(what: str, name: str, known: Sequence[str]) -> str:
    """``unknown {what} 'name'; known: a, b``, with `` (did you mean 'a'?)`` before the
    list when ``meant`` finds the name ``name`` was meant as."""
    guess = meant(name, known)
    hint = "" if guess is None else f" (did you mean {guess!r}?)"
    return f"unknown {what} {name!r}{hint}; known: {', '.join(known)}"


def meant(name: str, known: Iterable[str], *, alike: float = ALIKE) -> str | None:
    """The known name most like ``name``, case aside, if at least ``alike`` alike; None
    when none is, or two are as close (``to-x``: ``to-c`` or ``to-b``?)."""
    lowered = {k.lower(): k for k in known}
    word = name.lower()
    ranked = sorted(((_alike(word, k), k) for k in lowered), reverse=True)[:2]
    if not ranked or ranked[0][0] < alike:
        return None
    if len(ranked) == 2 and ranked[1][0] == ranked[0][0]:
        return None
    return lowered[ranked[0][1]]


def _alike(word: str, other: str) -> float:
    """difflib's ratio of the two, as ``difflib.get_close_matches`` measures it."""
    return difflib.SequenceMatcher(None, other, word).ratio()


def unknown_variables(
    environ: Mapping[str, str], read: Collection[str], *, prefix: str, not_settings: Iterable[str]
) -> list[tuple[str, str | None]]:
    """Each variable of ``environ`` named with ``prefix`` that is neither in ``read`` (the
    variables something reads, upper case) nor begins with one of ``not_settings``, matched
    ignoring case as the settings match names, with the name in ``read`` it was meant as
    (``meant``), if any; in name order."""
    ignored = tuple(not_settings)
    unknown = []
    for name in sorted(environ):
        upper = name.upper()
        if upper.startswith(prefix) and upper not in read and not upper.startswith(ignored):
            unknown.append((name, meant(upper, read, alike=VARIABLE_ALIKE)))
    return unknown


def not_a_setting(name: str, close: str | None) -> str:
    """The warning of a variable nothing reads, naming the setting it was meant as
    (``close``) where there is one."""
    hint = f" (did you mean {close}?)" if close else " (kvwise config lists them)"
    return f"{name} is not a kvwise setting: nothing reads it{hint}"
