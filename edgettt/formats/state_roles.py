"""What each tensor of a decode state is: its role, as flash-linear-attention's cache and onnxruntime-genai
name state (recurrent_state, conv_state), not its name in a layer's dict. A family declares each state tensor's
role and level (`state_roles()` of its state layers); the state formats, the export's crossing of the graphs,
genai's binding, state files and `info` read the roles.
"""

from __future__ import annotations

from dataclasses import dataclass

RECURRENT = "recurrent_state"  # a linear attention's committed state S = [W; b] (TTT's converted layers)
OPEN_SUM = "open_sum"  # the open mini-batch's sum of key-value products A, committed at its end
OPEN_KEYS = "open_keys"  # the open mini-batch's keys, kept in place of A (the int12 formats)
OPEN_VALUES = "open_values"  # its values, likewise
CONV = "conv_state"  # a causal convolution's last inputs
FAST_WEIGHTS = "fast_weights"  # fast weights as applied (the original TTT layer's W, b; LaCT's W_i)
FAST_WEIGHT_SUMS = "fast_weight_sums"  # unnormalised sums the applied fast weights are normalised from (LaCT)
GRADIENT_SUMS = "gradient_sums"  # the unfinished mini-batch's or chunk's running gradient sums
MOMENTUM = "momentum"  # momentum buffers of the fast weights' updates
GATE_SUM = "gate_sum"  # the unfinished chunk's running sum of momentum gates
WINDOW_KEYS = "window_keys"  # a sliding window's keys (a ring buffer)
WINDOW_VALUES = "window_values"  # and its values

ROLES = (RECURRENT, OPEN_SUM, OPEN_KEYS, OPEN_VALUES, CONV, FAST_WEIGHTS, FAST_WEIGHT_SUMS, GRADIENT_SUMS, MOMENTUM,
         GATE_SUM, WINDOW_KEYS, WINDOW_VALUES)
HELD_ACROSS_COMMITS = (RECURRENT, FAST_WEIGHTS)  # what a sequence has learned so far (genai's recurrent_state)


@dataclass(frozen=True)
class StateRole:
    """A state tensor's role and the fast-weight level (1..) it belongs to; 0 for none (conv tails, windows)."""

    role: str
    level: int = 0

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"state role {self.role!r} is not one of {', '.join(ROLES)}")
