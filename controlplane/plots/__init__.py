"""Figures of the offline commands, as PNG files (the optional ``plot`` extra: matplotlib).

Owns turning results the library already computed into pictures: ``common`` (what every
figure shares: the optional import, the size in pixels, saving), ``trace_figures`` (the
paper's figures of any trace, for ``kvwise trace stats --plot``), ``capacity_curve``
(hit ratio against cache size per policy, for ``kvwise replay --plot``) and ``simulate``
(``kvwise simulate --plot``). It must never compute a statistic, replay or simulate
anything, and nothing outside it imports matplotlib.
"""
