"""The numpy array types of the control plane's numeric code, named once.

Owns ``I32``, ``I64`` and ``F64``: the trace's columns and everything computed from them
(synthesis, statistics, fitting, replay) are flat arrays of these dtypes; and ``SLICE``,
how many accesses a pass over a whole trace takes at a time. It must never hold logic or
import anything of kvwise.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

I32 = NDArray[np.int32]
I64 = NDArray[np.int64]
F64 = NDArray[np.float64]

SLICE = 1 << 20
"""Accesses a sliced pass over a trace's block column takes at a time: its temporaries (a
few arrays of this many entries) stay at a few tens of MiB whatever the trace's size,
where a pass over the whole column would hold several column-sized ones at once."""
