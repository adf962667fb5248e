"""Kernels that apply quantized weights; ``select`` picks one per weight kind, once, at load."""
