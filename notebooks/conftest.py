# `pytest --nbval-lax notebooks` runs the course notebooks. The student versions in student/ are generated from them
# (`ttlib grade release`) and raise NotImplementedError by design: tests/test_grading.py grades them instead.
collect_ignore = ["student"]
