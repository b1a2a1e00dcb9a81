"""The reference code's policy (``wa-ref``) and fitter, kept only to compare against.

The paper authors' published code fitted once, offline, with shortcuts (see
docs/policy.md); replays run it beside ``wa`` to measure what each shortcut costs. Nothing
here is in the production policy registry; replay's catalogue offers it by name.
"""
