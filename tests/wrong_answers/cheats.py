"""Submissions that try to earn notebook 01's exercise 1 (scaled dot-product attention) without writing it, one per
way of cheating an in-process checker. tests/test_cheats.py runs each through the graders' hidden tests (a separate
process on the submission's definitions, ttlib.exercises.hidden) and through the static scan (ttlib.grading.scan):
each must score 0 on the exercise, and each is flagged for review. tests/test_grading.py grades some of them with
nbgrader.

CHEATS: {name: (the class of cheat, the source of the exercise cell)}.
"""

SIGNATURE = "def scaled_dot_product_attention(q, k, v, mask=None):\n"
ALLOWED = "    allowed = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool) if mask is None else mask\n"

CHEATS = {
    "code_object": ("copies the reference's code: a function rebuilt from its code object", '''import types

_theirs = types.FunctionType(ttlib.model.attention.explicit_attention.__code__, globals())


''' + SIGNATURE + ALLOWED + '''    return _theirs(q, k, v, allowed)
'''),
    "code_object_in_call": ("copies the reference's code, at call time", "import types\n\n\n" + SIGNATURE + ALLOWED +
                            '''    theirs = types.FunctionType(
        ttlib.model.attention.explicit_attention.__code__, globals())
    return theirs(q, k, v, allowed)
'''),
    "exec_source": ("copies the reference's code: its source exec'd into the notebook", '''import inspect

exec(inspect.getsource(ttlib.model.attention.explicit_attention).replace("def explicit_attention", "def _copied"))


''' + SIGNATURE + ALLOWED + '''    return _copied(q, k, v, allowed)
'''),
    "exec_source_in_call": ("copies the reference's code at call time, by exec", "import inspect\n\n\n" + SIGNATURE +
                            ALLOWED + '''    scope = {}
    exec(inspect.getsource(ttlib.model.attention.explicit_attention), {"math": math, "torch": torch, "F": F}, scope)
    return scope["explicit_attention"](q, k, v, allowed)
'''),
    "private_copy": ("imports a private copy of a ttlib module", '''import importlib.util


''' + SIGNATURE + '''    spec = importlib.util.find_spec("ttlib.model.attention")
    private = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(private)
''' + ALLOWED + '''    return private.explicit_attention(q, k, v, allowed)
'''),
    "undo_guard": ("undoes the guard around the call: profile hook and PyTorch's function mode", '''import sys


''' + SIGNATURE + '''    sys.setprofile(None)
    while torch._C._len_torch_function_stack() > 0:
        torch._C._pop_torch_function_stack()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
'''),
    "aten_name": ("calls PyTorch's attention through another name", SIGNATURE + '''    aten = torch.ops.aten
    return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=mask)[0]
'''),
    "other_process": ("computes the answer in another process", '''import pickle
import subprocess
import sys

_helper = None  # a Python process that computes every answer, started at the first call


''' + SIGNATURE + '''    global _helper
    if _helper is None:
        program = ("import pickle, sys, torch.nn.functional as F\\n"
                   "while sys.stdin.buffer.peek(1):  # until the notebook's end closes the pipe\\n"
                   "    q, k, v, m = pickle.load(sys.stdin.buffer)\\n"
                   "    pickle.dump(F.scaled_dot_product_attention(q, k, v, attn_mask=m), sys.stdout.buffer)\\n"
                   "    sys.stdout.buffer.flush()")
        _helper = subprocess.Popen([sys.executable, "-c", program], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    pickle.dump((q, k, v, mask), _helper.stdin)
    _helper.stdin.flush()
    return pickle.load(_helper.stdout)
'''),
    "checker_frame": ("reads the expected value from the checker's frames", '''import sys


''' + SIGNATURE + '''    frame = sys._getframe(1)
    while frame is not None:
        for name in ("expected", "want"):
            if name in frame.f_locals:
                return frame.f_locals[name]
        frame = frame.f_back
    raise NotImplementedError()
'''),
    "fake_checker": ("replaces the spec of the checking code so that the hidden tests load a fake", '''import sys
import types

fake = types.ModuleType("ttlib.exercises")
fake.__spec__ = None
sys.modules["ttlib.exercises"] = fake
sys.modules["ttlib.course.checks"] = fake


''' + SIGNATURE + '''    raise NotImplementedError()
'''),
    "ipython_hook": ("an IPython hook that wraps every later cell in try/except", '''def _swallow(lines):
    return ["try:\\n"] + ["    " + line for line in lines] + ["\\nexcept BaseException:\\n    pass\\n"]


get_ipython().input_transformers_post.append(_swallow)


''' + SIGNATURE + '''    raise NotImplementedError()
'''),
}
