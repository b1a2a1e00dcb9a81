"""Offline replay: the loop (engine), the bounds, the policy catalogue and the runner."""
