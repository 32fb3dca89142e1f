"""Repository tooling, apart from what learners import: Colab badges and set-up cells (`colab`), nbgrader release,
collection and export (`grade`), nbgrader's autograding plugins (`grade_plugins`), the whole course checked on an
offline GPU machine (`gpu_check`, `tools/gpu-check`) with the wheels it carries (`gpu_wheels`, `tools/gpu-wheels`),
and the course's notebook list.

NOTEBOOKS is the one list of the course's notebooks, in order, with the title the README's table shows: the Colab
badges, the grading and the tests all read it. A new notebook is added here.
"""

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
}
