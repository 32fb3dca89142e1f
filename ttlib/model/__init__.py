"""The model: attention with a key/value cache, the Trajectory GPT, and the tokenizer that turns trajectories into
its tokens and back."""

__all__: list[str] = []
