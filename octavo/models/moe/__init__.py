"""Mixture-of-experts: the ``FusedMoE`` layer, routing, and per-platform expert kernels.

``layer.FusedMoE`` routes tokens (``router.select_experts``) and hands the routed batch to the
kernel the platform prefers (``Platform.moe_backend_priority``, walked by
``kernels.choose_kernel``): ``triton_grouped`` on CUDA/ROCm, ``cpu_grouped`` on CPUs,
``torch_ref`` everywhere (the readable reference the others are tested against). Kernels are
imported only when chosen, so importing this package pulls in neither Triton nor a model.
"""
