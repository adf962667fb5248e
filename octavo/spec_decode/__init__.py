"""Speculative decoding: draft proposers and the verification of drafts by the target model."""
