"""What a layer with a quantizable accumulated state shares (DESIGN section 5.2): its state format and
the int8 scales, buffers `state_scale_<level>` [buckets, H, rows] (or [H, rows]) and
`state_bucket_tokens`, saved with the model; the row scales of a state committed at a position; the
function that rounds a committed state. A layer using it defines `initial_states()`: one [H, rows,
cols] tensor a level (the converted TTT layer's S0 per level, LaCT's initial fast weights that learn),
what the int8 codes are taken relative to.
"""

from __future__ import annotations

import torch

from edgettt.errors import EdgetttError
from edgettt.formats.state_formats import FLOAT32_STATE, StateFormat, state_format
from edgettt.formats.state_roles import RECURRENT, StateRole


class StateScales:
    state_format: StateFormat = FLOAT32_STATE  # the object; config.json keeps its name

    def initial_states(self) -> list[torch.Tensor]:
        raise NotImplementedError

    formatted_role = RECURRENT  # the role of the state tensors a state format keeps (`state_roles`)

    def state_roles(self) -> dict[str, StateRole]:
        """Each decode-state tensor's role and level, by its name in the layer's state dict."""
        raise NotImplementedError

    def formatted_state_names(self) -> set[str]:
        """The decode-state tensors the state format keeps, one a level (the rest stay float)."""
        return {name for name, r in self.state_roles().items() if r.role == self.formatted_role}

    def set_state_format(self, fmt: "StateFormat | str", scales: list[torch.Tensor] | None = None,
                         bucket_tokens: int = 0) -> None:
        """A format (or its name): fp32 | fp16 | int12 | int8 (per-row `scales`, one [buckets, H, Dk] or
        [H, Dk] per level, buckets of `bucket_tokens` positions) | int8-tensor (same buffers)."""
        fmt = state_format(fmt)
        self._check_scales(fmt, scales or [], bucket_tokens)
        self.state_format = fmt
        for level, scale in enumerate(scales or [], start=1):
            self.register_buffer(f"state_scale_{level}", scale.float().clone())
        if scales and scales[0].dim() == 3 and scales[0].shape[0] > 1:
            self.register_buffer("state_bucket_tokens", torch.tensor([int(bucket_tokens)]))  # saved with the model
            self.bucket_tokens = int(bucket_tokens)  # read as an int (an exported graph must not read the buffer)
        elif hasattr(self, "state_bucket_tokens"):  # one scale for all positions now: nothing stale to save
            del self.state_bucket_tokens, self.bucket_tokens

    def _check_scales(self, fmt: StateFormat, scales: list[torch.Tensor], bucket_tokens: int) -> None:
        """One table per level, [buckets, H, Dk] or [H, Dk] as the initial state's rows, positive."""
        rows = [tuple(s0.shape[:2]) for s0 in self.initial_states()]
        if fmt.int8 and len(scales) != len(rows):
            raise EdgetttError(f"state format {fmt.name}: {len(scales)} scale tables for {len(rows)} state levels; "
                               "calibrate and quantize the model again")
        for level, (scale, want) in enumerate(zip(scales, rows), start=1):
            if scale.dim() not in (2, 3) or tuple(scale.shape[-2:]) != want:
                raise EdgetttError(f"state_scale_{level} is {tuple(scale.shape)}, expected [buckets, {want[0]}, "
                                   f"{want[1]}]; calibrate and quantize the model again")
            if scale.device.type != "meta" and not (torch.isfinite(scale).all() and (scale > 0).all()):
                raise EdgetttError(f"state_scale_{level} holds scales that are not positive and finite; "
                                   "calibrate and quantize the model again")
            if scale.dim() == 3 and scale.shape[0] > 1 and int(bucket_tokens) < 1:
                raise EdgetttError(f"state_scale_{level} has {scale.shape[0]} position buckets but no bucket "
                                   "width; calibrate and quantize the model again")

    def state_scale(self, level: int, position) -> torch.Tensor:
        """[H, Dk]: the row scales of the state committed at `position` (tokens seen; an int, or a
        0-d tensor in an exported graph)."""
        table = getattr(self, f"state_scale_{level}")
        if table.dim() == 2 or table.shape[0] == 1:
            return table.reshape(table.shape[-2:])
        last = table.shape[0] - 1
        if torch.is_tensor(position):
            bucket = torch.clamp(position // self.bucket_tokens, max=last)
            return table.index_select(0, bucket.reshape(1))[0]
        return table[min(position // self.bucket_tokens, last)]

    def requantizer(self, level: int):
        """None, or S, position -> S as stored after a commit at `position`."""
        return self.state_format.requantizer(self.initial_states()[level - 1].detach(),
                                             lambda position: self.state_scale(level, position))

