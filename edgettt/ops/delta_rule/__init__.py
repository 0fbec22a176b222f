"""The (gated) delta rule, the state update of DeltaNet and Gated DeltaNet: reference.py (recurrent and chunk,
plain torch, one signature)."""
