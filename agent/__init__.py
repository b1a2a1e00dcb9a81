"""kvwise agent: what runs inside an inference worker.

Owns the eviction policies (``policies``, ``device_evictor``), the event path from the
engine thread to Redis (``recorder``, ``history``, ``runtime.publisher``), the policy
subscriber and heartbeat (``runtime``), the wire contract (``wire``) and the engine
integrations (``integrations``). It must never import ``controlplane``, fastapi, scipy or
apscheduler: it lives in the engine process and stays light.
"""
