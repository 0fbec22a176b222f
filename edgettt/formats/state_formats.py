"""How a converted layer keeps its accumulated state S between mini-batch commits (DESIGN section 5).

A leaf (plain torch, nothing of edgettt): the model, the decode kernel's reference and the ONNX
graph's state operators all round the state with the formula written here, once.

    fp32         S as it is
    fp16         S rounded to half precision at every commit
    int12        S - S0 in two codes a value, int8 and int4 (12 bits), on a step per sequence, head and
                 row recomputed from the state at every commit (no calibration, nothing clipped): 1.5
                 bytes a value and 4 a row (S0: the learned initial state, a model constant; the part
                 that moves is smaller); a TTT layer keeps the open mini-batch's keys and values
                 (float16) in place of the float32 sum A; S crosses the exported graphs' boundary in its codes.
                 Measured against the others in benchmarks/results/state_options.md
    int12-kv8    int12's S with the open mini-batch in 8 bits: a slot's values in int8 on a step of their own, its
                 keys likewise after a Hadamard rotation (their constant feature, the 1 of the bias row, not
                 kept): 26% of the fp32 state where int12 is 32% (benchmarks/results/state_bits.md); crosses the
                 exported graphs' boundary in those codes (`crossing`, `encode`, `decode`); a family whose state
                 keeps no open mini-batch (LaCT) refuses it (`LanguageModel.state_format_refusal`)
    int8         S - S0 in int8, one calibrated scale per head and row for each position bucket
    int8-tensor  S itself in int8, one uncalibrated scale per layer and level: max |S0| / 127 (the
                 plain-rounding baseline the calibrated format is measured against)

A name with a number states the bits a value of S takes. Old names still read (`RENAMED`):
int8-calibrated is int8; a model file saying int8 without calibrated scales was written when int8
named the 12-bit format (`quant.apply.prepare_quantized` reads it as int12).

The int12 formula, with d = S - S0 and step [..., Dk, 1] = max |d| over the row / 127:

    c8 = round(d / step)  (in [-127, 127]: the step covers the row)
    c4 = clamp(round((d - c8 step) / (step / 15)), -7, 7)  (the remainder is within step / 2: 7.5 fine steps)
    S  = S0 + (c8 + c4 / 15) step                          (|error| <= step / 30)

The int8 formula, with `scale` [H, Dk] (one per head and state row) and S0 [H, Dk, Dv]:

    codes = clamp(round((S - S0) / scale), -127, 127)     (round half to even, as torch.round)
    S     = S0 + codes * scale

A state format is an object in `STATE_FORMATS`; `state_format(name)` finds it.
"""

from __future__ import annotations

import torch

from edgettt.formats.state_roles import OPEN_KEYS, OPEN_VALUES, RECURRENT

STATE_CLIP = 127  # the int8 state uses [-127, 127]: symmetric, so -S is as exact as S


def _row_steps(scale: torch.Tensor, S0: torch.Tensor) -> torch.Tensor:
    """[H, Dk] scales as [H, Dk, Dv] steps. No size-1 dims: they broadcast against any S, also inside
    an exported ONNX Scan (whose captured tensors get dynamic sizes, which a size-1 dim would not
    broadcast with)."""
    return scale[..., None].expand(S0.shape)


def int8_state_codes(S: torch.Tensor, S0: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The int8 codes of S [..., H, Dk, Dv] (as float values in [-127, 127]; `.to(torch.int8)` stores them)."""
    return torch.clamp(torch.round((S - S0) / _row_steps(scale, S0)), -STATE_CLIP, STATE_CLIP)


def int8_state_values(codes: torch.Tensor, S0: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """S from its int8 codes: S0 + codes * scale."""
    return S0 + codes.to(S0.dtype) * _row_steps(scale, S0)


def requantize_int8_state(S: torch.Tensor, S0: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """S as the int8 state stores it (rounded to its grid), in float."""
    return int8_state_values(int8_state_codes(S, S0, scale), S0, scale)


OPEN_DTYPE = torch.float16  # the type of the open mini-batch's key and value buffers


def hadamard(n: int, dtype=torch.float32) -> torch.Tensor:
    """An orthonormal [n, n] matrix: the normalised Hadamard matrix of the largest power of two dividing n, repeated
    along the diagonal (n = 64: one Sylvester matrix; n = 48: three of 16)."""
    block = n & -n
    H = torch.ones(1, 1, dtype=dtype)
    while H.shape[0] < block:
        H = torch.cat((torch.cat((H, H), 1), torch.cat((H, -H), 1)), 0)
    return torch.block_diag(*[H / block ** 0.5] * (n // block))


def int8_slot_codes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, step) of x [..., D] on an int8 grid a row (a slot: one token's key or value): step [..., 1] = max |x|
    over the row / 127, codes as float values in [-127, 127]."""
    step = (x.abs().amax(-1, keepdim=True) / STATE_CLIP).clamp_min(1e-30)
    return torch.clamp(torch.round(x / step), -STATE_CLIP, STATE_CLIP), step


def int8_slots(x: torch.Tensor) -> torch.Tensor:
    """x on its int8 grid a slot (`int8_slot_codes`), as values."""
    codes, step = int8_slot_codes(x)
    return codes * step


def int8_rotated_keys(ka: torch.Tensor) -> torch.Tensor:
    """Keys [..., Dk] (the last feature the constant 1 of `augment`, kept as it is) on an int8 grid a slot in a
    Hadamard-rotated basis: a few features carry most of a key's size, and rotated they share one step with the
    rest (plain int8 keys cost 10x the KLD: benchmarks/results/state_bits.md)."""
    H = hadamard(ka.shape[-1] - 1, ka.dtype).to(ka.device)
    return torch.cat((int8_slots(ka[..., :-1] @ H) @ H.T, ka[..., -1:]), dim=-1)


FINE_STEPS = 15  # the int12 format's second code: steps of step / 15, in [-7, 7] (4 bits, symmetric)


def two_level_codes(S: torch.Tensor, S0: torch.Tensor):
    """The int12 format's codes of S: (coarse, fine, step) with coarse and fine as float values (in
    [-127, 127] and [-7, 7]) and step [..., Dk, 1] = max |S - S0| over each row / 127."""
    d = S - S0
    step = (d.abs().amax(-1, keepdim=True) / STATE_CLIP).clamp_min(1e-30)  # (a row that has not moved: 0)
    coarse = torch.round(d / step)
    half = FINE_STEPS // 2
    fine = torch.clamp(torch.round((d - coarse * step) * (FINE_STEPS / step)), -half, half)
    return coarse, fine, step


def two_level_values(coarse: torch.Tensor, fine: torch.Tensor, step: torch.Tensor, S0: torch.Tensor) -> torch.Tensor:
    """S from the int12 format's codes: S0 + (coarse + fine / 15) step."""
    return S0 + (coarse + fine / FINE_STEPS) * step


def two_level_round(S: torch.Tensor, S0: torch.Tensor) -> torch.Tensor:
    """S on the int12 format's grid: S0 + (c8 + c4 / 15) step, the step max |S - S0| over each row / 127."""
    return two_level_values(*two_level_codes(S, S0), S0)


class TwoLevelRounding:
    """The int12 format's commit, (S, position) -> S on its grid around `offset` (S0). An object, not a
    lambda, so that a prefill's whole chain of commits can be handed to one kernel
    (`linear_attention.committed_states`, `ops.linear_attention.commits`), which needs the offset."""

    def __init__(self, offset: torch.Tensor):
        self.offset = offset

    def __call__(self, S: torch.Tensor, position) -> torch.Tensor:
        return two_level_round(S, self.offset)


def pack_fine(fine: torch.Tensor) -> torch.Tensor:
    """Fine codes [..., Dv] (Dv even, values in [-7, 7]) as uint8 [..., Dv / 2]: column j in the low
    nibble and column j + Dv / 2 in the high one, each offset by 8 (the decode kernel reads the two
    halves of a row as two tiles)."""
    half = fine.shape[-1] // 2
    low, high = fine[..., :half] + 8, fine[..., half:] + 8
    return (low.to(torch.int32) | (high.to(torch.int32) << 4)).to(torch.uint8)


def unpack_fine(packed: torch.Tensor) -> torch.Tensor:
    """`pack_fine`'s inverse, as float32 values in [-7, 7]."""
    p = packed.to(torch.int32)
    return torch.cat(((p & 0xF) - 8, (p >> 4) - 8), dim=-1).to(torch.float32)


class StateFormat:
    """One way to keep S. `requantizer` gives the function applied at every mini-batch commit. A layer
    holds its format object (`StateScales.state_format`); the model's config.json names it, and the format
    loads itself into a layer from what a saved model holds (`load`, `saved_state_format`)."""

    name = "fp32"
    summary = "float32, as computed"  # one line (the command line's --state help lists them)
    bytes_per_element = None  # of S as stored (None: as the model computes it); A and the rest stay float
    row_bytes = 0  # kept beside the values for each row of S (a step)
    keeps_keys_and_values = False  # the open mini-batch's keys and values (float16) in place of A
    open_int8 = False  # ... on int8 grids (`kept_open`: keys rotated by `hadamard`, values a slot)
    int8 = False  # crosses an exported graph's boundary as int8 codes (with its scales inside the graph)
    needs_calibration = False
    rounds_at_run_time = False  # at every commit: one ulp of difference can flip a rounding
    token_kernel = True  # the decode token kernel (`ops.linear_attention.decode_token`) rounds as this format does

    @property
    def is_float32(self) -> bool:
        """S kept as the model computes it: nothing rounded at a commit."""
        return self.bytes_per_element is None

    def requantizer(self, S0: torch.Tensor, scale_of):
        """None, or (S, position) -> S as stored after a commit at `position`. `scale_of(position)`
        gives the [H, Dk] scales of a state committed there."""
        return None

    def offset(self, S0: torch.Tensor) -> torch.Tensor:
        """What the int8 codes are taken relative to."""
        return S0

    def kept_open(self, ka: torch.Tensor, vh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The open mini-batch's keys and values as a format that keeps them holds them (`keeps_keys_and_values`):
        rounded to float16, back in their own type."""
        return ka.to(OPEN_DTYPE).to(ka.dtype), vh.to(OPEN_DTYPE).to(vh.dtype)

    def kept_bytes(self, role: str, t: torch.Tensor) -> float:
        """Bytes a decode-state tensor of `role` (`state_roles`) that the format does not round (A, the open
        mini-batch's keys and values, a conv tail) takes as this format keeps it."""
        return t.numel() * t.element_size()

    def crossing(self, role: str, shape: list[int]) -> list[tuple[str, str, list[int]]] | None:
        """How a decode-state tensor of `role` (per-sequence `shape`) crosses an exported graph's boundary when
        the format keeps it in codes: (part, dtype, per-sequence shape) of each tensor it crosses as
        (`encode`, `decode`); None: as it is."""
        return None

    def encode(self, role: str, t: torch.Tensor, S0: torch.Tensor | None) -> list[torch.Tensor]:
        """The parts `crossing` names, of the state tensor t [B, ...] (S0: the initial state of its level)."""
        raise NotImplementedError

    def decode(self, role: str, parts: list[torch.Tensor], S0: torch.Tensor | None,
               filled: torch.Tensor) -> torch.Tensor:
        """`encode`'s inverse, in the model's type (filled [b]: 1 for the open mini-batch's slots in use)."""
        raise NotImplementedError

    def initial_scales(self, initial_states: list[torch.Tensor], calibration, layer: int):
        """(scales per level, bucket width in tokens) a layer gets when the format is applied."""
        return None, 0

    def describe(self) -> dict:
        """The manifest's words on an exported state tensor of this format."""
        return {"format": self.name}

    def load(self, layer, saved: dict[str, torch.Tensor], prefix: str) -> None:
        """Give `layer` (a `StateScales` layer) this format as a saved model holds it: its scales, one
        `{prefix}state_scale_<level>` a level, and their bucket width `{prefix}state_bucket_tokens`."""
        scales = [saved[k] for k in sorted(saved) if k.startswith(prefix + "state_scale_")]
        bucket_tokens = saved.get(prefix + "state_bucket_tokens", torch.tensor(0))
        layer.set_state_format(self, scales, int(bucket_tokens.reshape(-1)[0]) if bucket_tokens.numel() == 1 else -1)


class Float16State(StateFormat):
    name, bytes_per_element, token_kernel = "fp16", 2, False
    summary = "float16"

    def requantizer(self, S0, scale_of):
        return lambda S, position: S.half().to(S.dtype)


class Int12State(StateFormat):
    """S - S0 on a 12-bit grid in two codes (int8 + int4) a value, the step of each row recomputed from
    the state at every commit; the open mini-batch's keys and values in float16 in place of the float32
    sum A (a TTT layer's state; LaCT's running sums stay float). In the ONNX graphs the rounding is
    inside, and a TTT layer's S crosses in its codes (`crossing`; LaCT's fast weights as float32 values on the
    grid)."""

    name, bytes_per_element, row_bytes, rounds_at_run_time, keeps_keys_and_values = "int12", 1.5, 4, True, True
    summary = "12 bits a value in two codes, a step a row at every commit; open keys/values fp16"

    def requantizer(self, S0, scale_of):
        return TwoLevelRounding(S0.detach())

    def describe(self):
        return {"format": self.name, "scales": "one per sequence, head and row, recomputed at every commit",
                "dequantize": "S = S0 + (c8 + c4 / 15) * step[row]",
                "crossing": "S as c8 int8, c4 two a byte (column j low nibble, j + Dv/2 high, each + 8) and step "
                            "float32"}

    # S's codes come back exactly from its values: the row's largest |S - S0| is 127 steps by construction, the
    # rest multiples of step / 15 (`two_level_codes` of a state on the grid gives its codes again)
    def crossing(self, role, shape):
        if role != RECURRENT or shape[-1] % 2:  # (LaCT's fast weights, conv tails: they cross as they are)
            return None
        *lead, Dv = shape
        return [("c8", "int8", shape), ("c4", "uint8", [*lead, Dv // 2]), ("step", "float32", lead)]

    def encode(self, role, t, S0):
        coarse, fine, step = two_level_codes(t.float(), S0.float())
        return [coarse.to(torch.int8), pack_fine(fine), step[..., 0]]

    def decode(self, role, parts, S0, filled):
        c8, c4, step = parts
        return two_level_values(c8.float(), unpack_fine(c4), step[..., None], S0.float())


class Int12Int8OpenState(Int12State):
    """int12's S with the open mini-batch's keys and values in 8 bits a value (`int8_rotated_keys`, `int8_slots`),
    a float16 step a slot and buffer. The graphs round them inside and carry them as float16 values on that grid;
    so do the decode token kernel's float16 slots (`decode_token_int12` given the rotation)."""

    name, open_int8 = "int12-kv8", True
    summary = "int12 with the open mini-batch's keys and values in int8 (TTT only)"

    def kept_open(self, ka, vh):
        return (int8_rotated_keys(ka.float()).to(OPEN_DTYPE).to(ka.dtype),
                int8_slots(vh.float()).to(OPEN_DTYPE).to(vh.dtype))

    def kept_bytes(self, role, t):
        if role not in (OPEN_KEYS, OPEN_VALUES):
            return super().kept_bytes(role, t)
        slots = t.numel() // t.shape[-1]  # a code a value (a key's constant feature: none), a float16 step a slot
        return slots * (t.shape[-1] - (role == OPEN_KEYS) + 2)

    def describe(self):
        return {**super().describe(),
                "dequantize": "S = S0 + (c8 + c4 / 15) * step[row]; V = codes * step[slot]; K = [(codes * "
                              "step[slot]) @ H^T, 1 where the slot is filled] (H: the normalised Hadamard matrix)",
                "crossing": super().describe()["crossing"] + "; K and V as codes int8 and step float16 a slot"}

    # a slot's codes come back from its float16 values (within 0.06 of a step of the code; the keys rotated again)
    def crossing(self, role, shape):
        if role not in (OPEN_KEYS, OPEN_VALUES):
            return super().crossing(role, shape)
        H, b, D = shape
        return [("codes", "int8", [H, b, D - (role == OPEN_KEYS)]), ("step", "float16", [H, b])]

    def encode(self, role, t, S0):
        if role == RECURRENT:
            return super().encode(role, t, S0)
        x = t.float()
        if role == OPEN_KEYS:
            x = x[..., :-1] @ hadamard(x.shape[-1] - 1).to(x.device)
        codes, step = int8_slot_codes(x)
        return [codes.to(torch.int8), step[..., 0].to(OPEN_DTYPE)]

    def decode(self, role, parts, S0, filled):
        if role == RECURRENT:
            return super().decode(role, parts, S0, filled)
        codes, step = parts
        x = codes.float() * step.float()[..., None]
        if role == OPEN_KEYS:  # (the constant feature: 1 in a filled slot)
            x = x @ hadamard(x.shape[-1]).to(x.device).T
            x = torch.cat((x, filled.to(x.dtype)[:, None].expand(*x.shape[:-1], 1)), dim=-1)
        return x.to(OPEN_DTYPE)


class Int8State(StateFormat):
    """S - S0 with calibrated per-row scales for each position bucket (the commit's position picks it)."""

    name, bytes_per_element, int8, needs_calibration, rounds_at_run_time = "int8", 1, True, True, True
    summary = "8 bits, calibrated scales a row (needs --calib)"
    token_kernel = False

    def requantizer(self, S0, scale_of):
        offset = self.offset(S0.detach())
        return lambda S, position: requantize_int8_state(S, offset, scale_of(position))

    def initial_scales(self, initial_states, calibration, layer):
        return calibration.layer_scales(layer), calibration.bucket_tokens

    def describe(self):
        return {"format": self.name,
                "scales": "one per head and row (calibrated for int8: per position bucket of the last commit)",
                "dequantize": "S0 + q * scale[bucket, head, row]"}


class Int8TensorState(Int8State):
    """S itself, one uncalibrated scale per layer and level (max |S0| / 127): the plain-rounding baseline."""

    name, needs_calibration = "int8-tensor", False
    summary = "8 bits, one scale from the initial state"

    def offset(self, S0):
        return torch.zeros_like(S0)

    def initial_scales(self, initial_states, calibration, layer):
        return [torch.full(s0.shape[:2], s0.detach().abs().max().item() / STATE_CLIP) for s0 in initial_states], 0

    def describe(self):
        return {**super().describe(), "dequantize": "q * scale[head, row]"}


FLOAT32_STATE = StateFormat()
STATE_FORMATS = {f.name: f for f in (FLOAT32_STATE, Float16State(), Int12State(), Int12Int8OpenState(), Int8State(),
                                      Int8TensorState())}
RENAMED = {"int8-calibrated": "int8"}  # old name -> new: still read, with a note where a user typed it


def state_format(name: "str | StateFormat") -> StateFormat:
    """The format of a name (an old one too), or the format itself."""
    if isinstance(name, StateFormat):
        return name
    return STATE_FORMATS[RENAMED.get(name, name)]


def saved_state_format(name: str, saved: dict[str, torch.Tensor]) -> StateFormat:
    """The format a saved model's config names, read as today's: a file saying "int8" without calibrated
    scales is an older one, whose "int8" named the 12-bit format (int12, which keeps no scales)."""
    if RENAMED.get(name, name) == "int8" and not any(".state_scale_" in k for k in saved):
        return STATE_FORMATS["int12"]
    return state_format(name)


def renamed_note(name: str) -> str | None:
    """The one-line note for an old name a user gave, else None."""
    return f"note: the state format {name} is now called {RENAMED[name]}" if name in RENAMED else None
