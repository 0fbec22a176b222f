"""TTT's layers with their Triton kernels: subclasses that `edgettt.prepare` gives a model's layers
in place (`use_kernels`, `use_compiled_decode`), the way torchao's `quantize_` swaps modules. Each
computes what its plain layer computes (the same parameters and state dict), through a kernel where one
takes the inputs and through the plain layer's code elsewhere (autograd where a kernel has no backward, a
calibration observer, a shape or format no kernel covers).

- `TTTLayerKernels`: TTT-Linear from the fresh state over whole mini-batches as one exact-form kernel with
  a backward (`ops.linear_attention.train`), in training and in inference (a distillation's teacher: one launch a layer
  instead of a dozen a mini-batch).
- `LinearAttentionKernels`: the converted layer's prefill (`ops.linear_attention.prefill`, both forms, a float state;
  the exact form with the int12 state's commits), the int12 state's chain of commits (`ops.linear_attention.commits`)
  and the float decode step (`ops.linear_attention.decode`).
- `CompiledDecodeLayer`: what a decode step that torch.compile traces takes: a token's products with the
  state written as element-wise products and sums (inductor fuses them with what makes and reads them, where
  a matmul is a cuBLAS GEMV each: a compiled decode step is bound by its count of kernels,
  `benchmarks/results/compiled_decode_h200.md`), the open mini-batch of the int12 state read from its slots,
  and with `token_kernel` each token from the layer's input to its output in one operation
  (`ops.linear_attention.decode_token`).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from edgettt.families.ttt.converted import LinearAttentionLayer
from edgettt.ops import mini_batch_etas, row_product
from edgettt.ops.common import INTERPRETER, mini_batch_supported
from edgettt.ops.linear_attention import decode_token  # noqa: F401  (registers edgettt::decode_token, decode_token_int12)
from edgettt.ops.linear_attention import commits, decode, prefill
from edgettt.ops.linear_attention import reference as la
from edgettt.ops.linear_attention import train
from edgettt.formats.state_formats import TwoLevelRounding, hadamard
from edgettt.families.ttt.original import TTTLayer


def kernels_run_on(x: torch.Tensor) -> bool:
    """Whether the kernels can run on `x`'s device: CUDA, or any under Triton's interpreter (the CPU tests)."""
    return x.is_cuda or INTERPRETER


def needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


class TTTLayerKernels(TTTLayer):
    def forward(self, x, state, start, decode=False, residual=None):
        b = self.config.mini_batch_size
        if self.mlp or start != 0 or x.shape[1] % b or not mini_batch_supported(b) or not kernels_run_on(x):
            return super().forward(x, state, start, decode, residual)
        # position 0 is the fresh state of `init_state`: the kernel starts from the parameters W1, b1
        q, k, v = self.project(x, state, start)
        lr, eta_tok, d = self.learning_rates(x), mini_batch_etas(self.learnable_token_idx), self.head_dim
        out, S = train.exact_train(q, k, v, lr, torch.cat((self.W1, self.b1), dim=1), self.ttt_norm_weight,
                                   self.ttt_norm_bias, eta_tok)
        state["W1"], state["b1"] = S[:, :, :d].to(state["W1"].dtype), S[:, :, d:].to(state["b1"].dtype)  # GW1, Gb1: 0
        return self.finish(x, out, residual)


def committed_states(S, U, eta_last, requant=None, ends=None, decay=None):
    """`la.committed_states`, the int12 state's chain of commits as one kernel (`ops.linear_attention.commits`) outside
    autograd (the kernel has no backward); a decay's S0 is the layer's initial state, the format's offset."""
    if isinstance(requant, TwoLevelRounding) and kernels_run_on(U) and not needs_grad(U, S):
        return commits.two_level_commits(S, requant.offset, U, eta_last, None if decay is None else decay.gamma)
    return la.committed_states(S, U, eta_last, requant, ends, decay)


class LinearAttentionKernels(LinearAttentionLayer):
    chunk = staticmethod(functools.partial(la.chunk, states=committed_states))

    def forward(self, x, state, start, decode=False, residual=None):
        prefill_kernel = None if decode else self._prefill_kernel(x)
        if prefill_kernel is None:
            return super().forward(x, state, start, decode, residual)
        q, k, v = self.project(x, state, start)
        return self.finish(x, prefill_kernel(state, q, k, v, self.learning_rates(x), start), residual)

    def _prefill_kernel(self, x):
        """The prefill kernel that takes this layer's tokens: both forms with a float state, the exact form
        with the int12 state's commits; None where none does (TTT-MLP, autograd (distillation trains through
        the plain path), a calibration observer, a mini-batch size the kernels do not take)."""
        if (self.mlp or self.observer is not None or needs_grad(self.state0)
                or not mini_batch_supported(self.config.mini_batch_size) or not kernels_run_on(x)):
            return None
        if self.state_format.is_float32:
            return self._prefill
        if self.config.form == "exact" and isinstance(self.requantizer(1), TwoLevelRounding):
            return self._exact_two_level
        return None

    def _prefill(self, st, q, k, v, lr, start):
        fn = prefill.parallel if self.config.form == "parallel" else prefill.exact
        if self.config.state_decay:  # (a decayed form is a parallel one)
            fn = functools.partial(prefill.parallel, decay=self.decay(1).gamma)
        # at a mini-batch boundary A is zero in every state a model makes (each mini-batch's end commits)
        A = None if start % self.config.mini_batch_size == 0 else st["A1"]
        out, S, A = fn(q, k, v, lr, self.state0, self.value_norm.weight, self.value_norm.bias, self.mask_eta,
                       start, st["S1"], A)
        st["S1"], st["A1"] = S.to(st["S1"].dtype), A.to(st["A1"].dtype)
        return out

    def _exact_two_level(self, st, q, k, v, lr, start):
        """The tokens up to the first mini-batch boundary and after the last one through the plain path
        (they fill the open mini-batch's buffers), the whole mini-batches between through the kernel
        (from a boundary the buffers are empty, and stay so)."""
        b, T = self.config.mini_batch_size, q.shape[2]
        lead = min((-start) % b, T)
        done = lead + (T - lead) // b * b
        plain = lambda sl, at: self._exact(st, q[:, :, sl], k[:, :, sl], v[:, :, sl], lr[:, :, sl], at,  # noqa: E731
                                           self.chunk)
        parts = [] if lead == 0 else [plain(slice(0, lead), start)]
        if done > lead:
            sl = slice(lead, done)
            out, S, _ = prefill.exact(q[:, :, sl], k[:, :, sl], v[:, :, sl], lr[:, :, sl], self.state0,
                                      self.value_norm.weight, self.value_norm.bias, self.mask_eta, start + lead,
                                      st["S1"], None, two_level=True)
            st["S1"] = S.to(st["S1"].dtype)
            parts.append(out)
        if done < T:
            parts.append(plain(slice(done, T), start + done))
        return torch.cat(parts, dim=2)

    @staticmethod
    def recurrent(qa, ka, vh, S, A, eta_tok, start, requant=None, decay=None):
        """`la.recurrent`, through the Triton decode-step kernel for one token with a float state."""
        if requant is not None or qa.shape[2] != 1 or not kernels_run_on(qa) or needs_grad(S):
            return la.recurrent(qa, ka, vh, S, A, eta_tok, start, requant, decay)
        S, A = S.contiguous(), A.contiguous()  # the kernel updates them in place (the step owns the state)
        decay = None if decay is None else (decay.gamma.detach(), decay.S0.detach().to(S.dtype))
        zbar = decode.decode_step(qa[:, :, 0].contiguous(), ka[:, :, 0].contiguous(), vh[:, :, 0].contiguous(), S,
                                  A, eta_tok.detach().contiguous(), start % eta_tok.shape[0], decay=decay)
        return zbar[:, :, None], S, A


def one_token(x: torch.Tensor, start) -> bool:
    """Whether x [B, T, ...] is one token at an int position (a compiled decode step's)."""
    return x.shape[1] == 1 and not torch.is_tensor(start)


class CompiledDecodeLayer(LinearAttentionKernels):
    """`LinearAttentionKernels` whose decode tokens are written for torch.compile (the module docstring)."""
    token_kernel = False  # each token in one operation (`use_compiled_decode(token_kernel=True)`)

    def forward(self, x, state, start, decode=False, residual=None):
        if decode and self.token_kernel and one_token(x, start) and self.token_kernel_applies():
            return self._decode_token(x, state, start, residual)
        return super().forward(x, state, start, decode, residual)

    def learning_rates(self, x):
        """One token's gate as a product and a sum (a small product with a bias is a split-K GEMV, its
        reduction and a bias epilogue: 3 cuBLAS kernels a layer)."""
        if x.shape[1] != 1:
            return super().learning_rates(x)
        logits = row_product(x, self.lr_proj.weight, self.lr_proj.bias)
        return self.lr_from_logits(logits, self.config.ttt_base_lr / self.head_dim)

    @staticmethod
    def _linear_values(ka, k, v, lr, S, gamma, beta):
        times = la.summed_times if ka.shape[2] == 1 else torch.matmul
        return la.linear_values(ka, k, v, lr, S, gamma, beta, times)

    @staticmethod
    def recurrent(qa, ka, vh, S, A, eta_tok, start, requant=None, decay=None):
        if qa.shape[2] != 1 or torch.is_tensor(start):
            return la.recurrent(qa, ka, vh, S, A, eta_tok, start, requant, decay)
        return la.recurrent_summed(qa, ka, vh, S, A, eta_tok, start, requant, decay)

    def _attend(self, attend, level, st, qa, ka, vh, start):
        if self.keeps_keys_and_values() and qa.shape[2] == 1 and self.observer is None and not torch.is_tensor(start):
            ka, vh = self.state_format.kept_open(ka, vh)  # as the slots hold them
            return self._attend_open_token(level, st, qa, ka, vh, start)
        return super()._attend(attend, level, st, qa, ka, vh, start)

    def _attend_open_token(self, level, st, qa, ka, vh, start):
        """One token with the open mini-batch in the buffers (`la.open_token`): the token's ka and vh written
        to its slot, A never formed; the buffers emptied at a commit."""
        b = self.config.mini_batch_size
        inner = start % b
        K, V = self._write_slot(st[f"K{level}"], ka, inner), self._write_slot(st[f"V{level}"], vh, inner)
        filled = (torch.arange(b, device=qa.device) <= inner).to(qa.dtype)
        zbar, st[f"S{level}"] = la.open_token(qa, K.to(qa.dtype), V.to(qa.dtype), filled, st[f"S{level}"],
                                              self.mask_eta, inner, self.requantizer(level), start + 1,
                                              self.decay(level))
        committed = inner == b - 1  # the next mini-batch starts with empty slots, as `_keep_open` leaves them
        st[f"K{level}"], st[f"V{level}"] = (torch.zeros_like(K), torch.zeros_like(V)) if committed else (K, V)
        return zbar

    def token_kernel_fits(self) -> bool:
        """`ops.linear_attention.decode_token` covers TTT-Linear (both forms) with q and k projected (not `share_qk`'s
        convolutions)."""
        return not self.mlp and not self.config.share_qk

    def token_kernel_applies(self) -> bool:
        """... with a state format the kernel rounds as (float, int12), outside calibration and autograd."""
        return (self.token_kernel_fits() and self.state_format.token_kernel and self.observer is None
                and not torch.is_grad_enabled())

    def _decode_token(self, x, st, start, residual=None):
        """One token from the layer's input to its output, the heads' part in one operation."""
        (q, k, v), lr = self.project_inputs(x), self.learning_rates(x)
        q, k, v = (self.split_heads(t)[:, :, 0] for t in (q, k, v))  # [B, H, d], not rotated
        common = (q, k, v, lr[:, :, 0], self.state0, self.value_norm.weight, self.value_norm.bias)
        decay = self.decay(1)
        place = (self.mask_eta, start % self.config.mini_batch_size, self.config.rope_theta, self.config.form == "exact",
                 None if decay is None else decay.gamma)
        if self.keeps_keys_and_values():  # the int12 formats: the open mini-batch's keys and values in slots
            rotation = self.open_rotation if self.state_format.open_int8 else None  # (int12-kv8)
            out = torch.ops.edgettt.decode_token_int12(*common, st["S1"], st["K1"], st["V1"], *place, rotation)
        else:
            out = torch.ops.edgettt.decode_token(*common, st["S1"], st["A1"], *place)
        return self.finish(x, out[:, :, None], residual)


KERNEL_LAYERS = {TTTLayer: TTTLayerKernels, LinearAttentionLayer: LinearAttentionKernels}


def use_compiled_decode(model: nn.Module, token_kernel: bool = True) -> int:
    """Every converted layer of `model` a `CompiledDecodeLayer` (after `use_kernels`, or in its place), its
    tokens in one operation where `token_kernel` and the layer takes it. Returns the number of layers that
    decode a token in one operation."""
    layers = [m for m in model.modules() if isinstance(m, LinearAttentionLayer)]
    for layer in layers:
        layer.__class__ = CompiledDecodeLayer
        layer.token_kernel = token_kernel
        if layer.state_format.open_int8:  # int12-kv8's key rotation, made once here (not in a compiled step)
            device = next(layer.parameters()).device
            layer.register_buffer("open_rotation", hadamard(layer.head_dim).to(device), persistent=False)
    with torch.no_grad():  # as a decode runs: counted outside autograd whatever the caller's mode
        return sum(layer.token_kernel and layer.token_kernel_applies() for layer in layers)


def compile_ttt_steps() -> None:
    """The original TTT layer's mini-batch steps compiled by torch.compile, for every TTT layer from now on:
    inductor fuses their chains of small elementwise operations (training TTT-MLP, which has no kernel).
    The first call of each shape compiles (about a minute)."""
    TTTLayer._linear_step = torch.compile(TTTLayer._linear_step, dynamic=False)
    TTTLayer._mlp_step = torch.compile(TTTLayer._mlp_step, dynamic=False)
