"""Attention backends: one contract (backend.py), many kernels (backends/)."""
