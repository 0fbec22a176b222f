"""LaCT (Large-Chunk Test-Time Training, model type `lact_swiglu`): the paper's own family.

    config.py              the public config keys and edgettt's (W1-only variant, form)
    window.py              the in-layer sliding-window attention and its ring buffer
    model.py               the model, with the public checkpoints' module names
    checkpoint.py          the size check of a public checkpoint (`checkpoint.load_model` loads it)
Its operations (the fast weights' chunk-recurrent form, the W1-only parallel form, their kernels) are in
`edgettt.ops.lact`.
"""
