"""kvwise control plane: traces, replay, fitting, the controller service and the CLI.

It imports from ``agent`` only the wire contract and the evictors (for offline replay),
and never imports torch or vllm.
"""
