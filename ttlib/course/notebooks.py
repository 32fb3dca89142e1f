"""The course's notebooks, in order, with the title the README's table shows: the one list the Colab badges, the
grading and the tests all read. A new notebook is added here."""

__all__ = ["NOTEBOOKS"]

NOTEBOOKS = {
    "00_offline_rl_as_sequence_modeling.ipynb": "offline RL as sequence modeling",
    "01_attention.ipynb": "attention",
    "02_trajectory_tokenizer.ipynb": "trajectory tokenizer",
    "03_trajectory_gpt.ipynb": "the Trajectory GPT",
    "04_kv_cache.ipynb": "KV cache",
    "05_beam_search.ipynb": "beam search",
    "06_critic.ipynb": "a critic that knows what an action does",
    "07_vectorized_rollouts.ipynb": "vectorized rollouts",
    "08_scaling_out_with_ray.ipynb": "scaling out with Ray",
    "09_decision_transformer.ipynb": "Decision Transformer",
    "10_beat_pbc.ipynb": "the challenge: beat %BC",
}
