"""What only the course's maintainers run, from a clone of the repository (never installed with ttlib):

    gpu_check, gpu_wheels   the whole course checked on an offline GPU machine (`tools/gpu-check`), and the wheels
                            it carries there (`tools/gpu-wheels`); docs/GPU.md
    outputs                 the solution notebooks run in full mode, their outputs committed (`python -m tools.outputs`)
    readme_figure           the README's figure, drawn from docs/RESULTS.md (`python -m tools.readme_figure`)
    colab                   the Colab badges and set-up cells, from pyproject.toml (`python -m tools.colab`)

Run them from the repository root, so that `tools` is importable; the tests import them the same way.
"""
