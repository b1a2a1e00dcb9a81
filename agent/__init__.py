"""kvwise agent: what runs inside an inference worker.

Owns the eviction policies (the CPU evictors), and later the event publisher, the policy
subscriber and the engine integrations. It must never import ``controlplane``, fastapi,
scipy or apscheduler: it lives in the engine process and stays light.
"""
