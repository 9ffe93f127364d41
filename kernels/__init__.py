"""The Triton kernels and their launchers: persistent_cta (one program per batch tile, the
whole R on chip), persistent_grid (R split across co-resident programs that meet at a grid
barrier; also the stepwise family), split_k (the split-K backward experiment), grid_barrier
(the in-kernel barrier and its host-side checks), cells (the cell equations, forward and
backward), dropout (the counter-based masks), compile_options. kernels/NOTES.md records what
each kernel choice cost or saved on a GPU."""
