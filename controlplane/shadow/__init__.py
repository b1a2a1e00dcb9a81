"""Shadow evaluation: what other policies, and other cache sizes, would have scored on the
traffic the workers actually served, estimated from a sample of it (docs/shadow.md)."""
