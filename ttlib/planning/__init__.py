"""Planning with the model: the beam search and its decoders (readable, fused, static, Triton), and the CUDA graphs
that replay a decoding step."""

__all__: list[str] = []
