"""``python -m controlplane`` is the ``kvwise`` command (used for child processes)."""

from controlplane.cli import main

main()
