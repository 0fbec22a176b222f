"""A TTT layer as a learned linear attention: the plain-torch reference (`reference`) and its kernels
(`prefill`, `decode`, `decode_token`, `commits`, `train`); the index is in `edgettt.ops`."""
