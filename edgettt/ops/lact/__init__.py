"""LaCT's operations: the plain-torch references (`reference`, `parallel`, `fast_weights`) and their
kernels (`triton`); the index is in `edgettt.ops`."""
