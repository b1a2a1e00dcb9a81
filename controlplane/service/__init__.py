"""The controller service: lifecycle, ingest, statistics, refit, the policy store.

Owns everything the running controller does with Redis: the leader lease, the ingest of
worker event streams, the refit job and its guard, publication of immutable policy
versions, and the Prometheus metrics. HTTP lives in ``controlplane.api``; the fitting
itself is pure (``controlplane.fit``).
"""
