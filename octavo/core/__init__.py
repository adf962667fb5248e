"""Hardware-agnostic core: requests, block pool, KV cache manager, scheduler, sampler.

Nothing in this package imports ``octavo.platforms``, ``octavo.models`` or ``octavo.worker``.
"""
