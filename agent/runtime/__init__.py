"""The agent's network side: the ``Agent`` facade and the threads that talk to Redis.

Owns the publisher (events out), the subscriber (policy versions in), the heartbeat and
the Redis connection they share. The engine thread calls only the ``Agent``'s hooks, which
never wait on the network; everything here that does runs on its own thread. It must
never be imported by the hot path (``agent.policies``, ``agent.recorder``,
``agent.history``).
"""
