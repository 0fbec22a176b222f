"""The int8, int4 and int6 storage layouts: how a weight matrix becomes bytes and back (plain torch).

A leaf: it imports nothing of edgettt, so the kernels can read these layouts (their references
dequantize with them) without importing the quantizer, which imports the kernels.

    int8  symmetric per output channel: qweight int8 [N, K], scales [N]; w = q * scale
    int4  asymmetric, groups of g along the input dim K, packed the way ONNX Runtime's
          com.microsoft.MatMulNBits reads it:
              qweight     uint8 [N, K/g, g/2]   two codes a byte, the lower K index in the low nibble
              scales      float [N, K/g]
              zero_points uint8 [N, ceil(K/g / 2)]  packed the same way
          w = (q - zero_point) * scale
    int6  asymmetric groups as int4, codes 0..63, each split into a 4-bit and a 2-bit part so that two
          MatMulNBits (4 and 2 bits) compute it: c = 4 hi + lo, zero = 4 zh + zl,
              w = (c - zero) * scale = (hi - zh) * 4 scale + (lo - zl) * scale
              qweight, zero_points          the 4-bit parts, as int4's
              qweight_low, zero_points_low  the 2-bit parts, four a byte (the lower K index in the low bits)
              scales float [N, K/g]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# ---- int8 -------------------------------------------------------------------------------------

def quantize_int8(w: torch.Tensor) -> dict[str, torch.Tensor]:
    scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return {"qweight": q, "scales": scale.float()}


def dequantize_int8(t: dict[str, torch.Tensor]) -> torch.Tensor:
    return t["qweight"].float() * t["scales"][:, None]


# ---- int4, MatMulNBits layout --------------------------------------------------------------------

def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[..., 2m] codes 0..15 -> [..., m] bytes, even index in the low nibble."""
    codes = codes.to(torch.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_nibbles: [..., m] bytes -> [..., 2m] codes."""
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2)


def group_grid(w: torch.Tensor, group: int, top: int = 15) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric min/max scale and integer zero point per group, codes 0..top (int4: 15, int6: 63): [N, K/g]
    each."""
    N, K = w.shape
    g = w.reshape(N, K // group, group)
    lo = g.amin(-1).clamp_max(0)
    hi = g.amax(-1).clamp_min(0)
    scale = ((hi - lo) / top).clamp_min(1e-12)
    zero = torch.round(-lo / scale).clamp(0, top)
    return scale, zero


def group_codes(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, top: int = 15) -> torch.Tensor:
    """Codes of w [N, K] with per-group scale/zero [N, K/g]."""
    group = w.shape[1] // scale.shape[1]
    s = scale.repeat_interleave(group, dim=1)
    z = zero.repeat_interleave(group, dim=1)
    return torch.clamp(torch.round(w / s) + z, 0, top)


def pack_int4(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> dict[str, torch.Tensor]:
    N, K = codes.shape
    blocks = scale.shape[1]
    zero_padded = F.pad(zero, (0, blocks % 2))
    return {
        "qweight": pack_nibbles(codes.reshape(N, blocks, K // blocks)),
        "scales": scale.float(),
        "zero_points": pack_nibbles(zero_padded),
    }


def dequantize_int4(t: dict[str, torch.Tensor]) -> torch.Tensor:
    N, blocks, half = t["qweight"].shape
    codes = unpack_nibbles(t["qweight"]).float()  # [N, blocks, g]
    zero = unpack_nibbles(t["zero_points"])[:, :blocks].float()
    return ((codes - zero[..., None]) * t["scales"][..., None]).reshape(N, blocks * 2 * half)


# ---- int6: a 4-bit and a 2-bit MatMulNBits part ----------------------------------------------------------

INT6_TOP = 63


def pack_crumbs(codes: torch.Tensor) -> torch.Tensor:
    """[..., 4m] codes 0..3 -> [..., m] bytes, index 4i + j in bits 2j (MatMulNBits' 2-bit order)."""
    codes = codes.to(torch.uint8)
    return codes[..., 0::4] | (codes[..., 1::4] << 2) | (codes[..., 2::4] << 4) | (codes[..., 3::4] << 6)


def unpack_crumbs(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_crumbs: [..., m] bytes -> [..., 4m] codes."""
    return torch.stack([(packed >> shift) & 3 for shift in (0, 2, 4, 6)], dim=-1).flatten(-2)


def pack_int6(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> dict[str, torch.Tensor]:
    """Codes 0..63 [N, K] and per-group scale and zero [N, K/g] in the int6 layout (module docstring)."""
    codes, zero = codes.to(torch.int32), zero.to(torch.int32)
    high = pack_int4(codes >> 2, scale, zero >> 2)
    N, K = codes.shape
    blocks = scale.shape[1]
    return {**high, "qweight_low": pack_crumbs(codes.reshape(N, blocks, K // blocks) & 3),
            "zero_points_low": pack_crumbs(F.pad(zero & 3, (0, -blocks % 4)))}


def dequantize_int6(t: dict[str, torch.Tensor]) -> torch.Tensor:
    N, blocks, quarter = t["qweight_low"].shape
    codes = (unpack_nibbles(t["qweight"]).float() * 4 + unpack_crumbs(t["qweight_low"]).float())
    zero = unpack_nibbles(t["zero_points"])[:, :blocks].float() * 4 + unpack_crumbs(t["zero_points_low"])[:, :blocks]
    return ((codes - zero[..., None]) * t["scales"][..., None]).reshape(N, blocks * 4 * quarter)
