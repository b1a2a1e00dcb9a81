"""The numpy array types of the control plane's numeric code, named once.

Owns ``I32``, ``I64`` and ``F64``: the trace's columns and everything computed from them
(synthesis, statistics, fitting, replay) are flat arrays of these dtypes. It must never
hold logic or import anything of kvwise.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

I32 = NDArray[np.int32]
I64 = NDArray[np.int64]
F64 = NDArray[np.float64]
