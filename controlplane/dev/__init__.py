"""Tools for a developer's machine: the demo stack, a simulated worker, an embedded Redis.

Owns nothing the production controller or agent needs; nothing outside ``controlplane.cli``
and the tests may import it.
"""
