"""The options of the fitted policies (wa, wa-ref, auto) that replay and simulate both take.

Owns their declarations and the help panel they are listed in: ``--categories``,
``--refit-every`` and ``--reuse-class`` fill the same fields of ``ReplayOptions`` in both
commands (simulate fits online exactly as replay does), so they are declared here once,
with their choices as ``ReplayOptions`` types them (Click refuses any other value). It must
never check their combinations nor build the options: each command does.
"""

from __future__ import annotations

from functools import partial
from typing import Annotated

import typer

from controlplane.cli.common import positive
from controlplane.replay.options import CategorySource, ReuseClass

fitted_option = partial(typer.Option, rich_help_panel="Fitted policies (wa, wa-ref)")
"""An option of the fitted policies, listed in their own panel of the help."""

CategoriesOpt = Annotated[
    CategorySource,
    fitted_option(help="labels: the trace's type_turn; auto: inferred from blocks and length"),
]
RefitEveryOpt = Annotated[
    float,
    fitted_option(
        parser=positive, metavar="SECONDS", help="Online fit: refit every this many trace seconds"
    ),
]
ReuseClassOpt = Annotated[
    ReuseClass,
    fitted_option(
        "--reuse-class",
        help="Split each category in two classes: hit: as the agent does "
        "(KVWISE_REUSE_CLASSES: a block found cached or evicted lately is a return); "
        "trace: accessed before or not, from trace knowledge (docs/policy.md)",
    ),
]
