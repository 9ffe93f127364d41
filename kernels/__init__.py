"""The Triton kernels and their launchers: persistent_cta (one program per batch tile, the
whole R on chip), persistent_grid (R split across co-resident programs that meet at a grid
barrier; also the stepwise family), grid_tiles (the options each persistent-grid or stepwise
launch takes from its shape, and what it holds on chip), split_k (the split-K backward),
grid_barrier
(the in-kernel barrier and its host-side checks), cells (the cell equations, forward and
backward), dropout (the counter-based masks), compile_options. kernels/NOTES.md records what
each kernel choice cost or saved on a GPU."""
