"""Compile options that every GPU launch of this package passes.

`enable_fp_fusion=True`: Triton contracts `a * b + c` into one FMA. Every plan, tolerance and
timing of this project was measured with it, as the default of Triton 3.4 to 3.9. Triton 3.9
warns at each process's first compile that 3.10 turns the default off; a kernel's numerics
and speed should not change with the Triton release, so the launches say it.
"""

FP_FUSION: dict[str, bool] = {"enable_fp_fusion": True}
