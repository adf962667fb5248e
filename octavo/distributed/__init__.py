"""Process groups, communicators and tensor-parallel layers.

With ``tensor_parallel_size == 1`` nothing here initialises ``torch.distributed``: the
parallel layers behave exactly like their plain counterparts.
"""
