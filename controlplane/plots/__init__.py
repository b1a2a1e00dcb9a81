"""Plots of the offline commands (``kvwise simulate --plot``), drawn with matplotlib.

matplotlib is the optional ``plot`` extra (``pip install 'kvwise[plot]'``): importing a
plot module without it raises ``ImportError``, which the CLI turns into a one-line error.
``common`` holds what every plot shares; one module per command draws its figure.
"""
