"""Model runner: flattened batch -> logits -> sampled tokens; KV cache tensors."""
