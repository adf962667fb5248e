"""Triton kernels behind the GPU attention backends (imported only once a backend is chosen)."""
