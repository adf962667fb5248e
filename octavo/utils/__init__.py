"""Leaf helpers any layer may import: optional-package probes and entry-point plugin loading.

Nothing in ``octavo.utils`` imports another octavo module except ``octavo.envs``, so a module
that only needs "is this package installed?" or "run the installed plugins" does not pull in
the platform layer (which would make the layers import each other in a loop).
"""
