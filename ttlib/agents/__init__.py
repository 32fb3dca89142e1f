"""The agents beside the Trajectory Transformer: its IQL critic, the baselines (BC, %BC, IQL's policy) and the
Decision Transformer."""

__all__: list[str] = []
