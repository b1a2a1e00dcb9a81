"""How an unknown name is told: the one wording of every name check, the agent's evictor
and the CLI's policies, routers and profiles alike.

Owns the message (``unknown policy 'LRU' (did you mean 'lru'?); known: lru, ...``) and
the rule for the known name a slip was surely meant as. It must never import the rest of
the agent or do I/O: the agent and the control plane both use it.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence


def unknown_name(what: str, name: str, known: Sequence[str]) -> str:
    """``unknown {what} 'name'; known: a, b``, with `` (did you mean 'a'?)`` before the
    list when ``_meant`` finds the name ``name`` was meant as."""
    guess = _meant(name, known)
    hint = "" if guess is None else f" (did you mean {guess!r}?)"
    return f"unknown {what} {name!r}{hint}; known: {', '.join(known)}"


def _meant(name: str, known: Sequence[str]) -> str | None:
    """The one known name that is ``name`` but for its case or about a letter; None when
    none is, or two are as close (``to-x``: ``to-c`` or ``to-b``?)."""
    lowered = {k.lower(): k for k in known}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=2, cutoff=0.8)
    return lowered[close[0]] if len(close) == 1 else None
