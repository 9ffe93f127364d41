"""Triton's interpreter (TRITON_INTERPRET=1): whether it was asked for, and whether it is in
effect.

Triton fixes at its first import whether `@triton.jit` makes interpreted functions, its own
library functions (`triton.language.standard`) included. A process that imports triton and
only then sets TRITON_INTERPRET=1 gets interpreted tritonrnn kernels calling compiled-mode
library functions, which fails deep inside a launch ("Cannot call @triton.jit'd outside of
the scope of a kernel"). `check_interpreter_in_effect` names the cause instead.
"""

from __future__ import annotations

import os
import sys


def interpreter_requested() -> bool:
    """TRITON_INTERPRET=1 in the environment."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def check_interpreter_in_effect() -> None:
    """Raises RuntimeError when TRITON_INTERPRET=1 came after triton's first import (its
    library functions are compiled-mode objects); nothing when triton is not imported yet,
    since its import will then see the variable."""
    if "triton" not in sys.modules:
        return
    import triton.language.standard as std

    kinds = {type(o).__name__ for o in vars(std).values()}
    if "JITFunction" in kinds and "InterpretedFunction" not in kinds:
        raise RuntimeError(
            "TRITON_INTERPRET: expected it set to 1 before triton was first imported (Triton "
            "decides at that import whether @triton.jit functions are interpreted), got it "
            "set afterwards in this process: export TRITON_INTERPRET=1 before starting "
            "Python, or set os.environ before anything imports triton"
        )
