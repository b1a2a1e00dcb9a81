"""``kvwise simulate``: a discrete-event serving simulator over any trace.

Requests arrive at trace times to engine instances (``router``), each stepping like a
continuous-batching server (``instance``) with its own KV cache under an eviction policy
from the replay catalogue (``kv``), timed by a roofline cost model (``cost``) over a
hardware/model profile (``profiles``). ``engine`` runs one policy at one capacity,
``runner`` a matrix of them, ``report`` defines the metrics. docs/simulate.md describes
the model, its calibration and what it measured.
"""
