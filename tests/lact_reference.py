"""A plain-torch transcription of the public LaCT language model (`lact_llm/lact_model/` of the LaCT
repository: `modeling_lact.py`, `layer_lact_swiglu.py`, `ttt_operation.py`), written from that code
line by line and checked against it by hand, for the tests only. It shares no code with edgettt's
LaCT (that is the point): whole sequences, fresh state, float32.

Substitutions, each the same function: flash-attn's causal window attention -> a dense softmax
with the band mask written out; fla's RMSNorm, RotaryEmbedding (non-interleaved) and GatedMLP ->
their formulas; einops rearranges -> reshape/permute. edgettt's two variant keys are honoured
(`lact_update_w0_w2` false: dw0 = dw2 = 0; `lact_weight_norm` false: no row renormalisation), as
the public code with those two lines removed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def rms(x, w, eps):
    x32 = x.float()
    return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rope(x, offset, theta):
    """fla RotaryEmbedding, interleaved=False: x [b, s, h, d]; cat(x1 cos - x2 sin, x1 sin + x2 cos)."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    t = torch.arange(offset, offset + x.shape[1], dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    cos, sin = freqs.cos()[None, :, None, :], freqs.sin()[None, :, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def l2_norm(x):
    return x / (x.norm(dim=-1, keepdim=True) + 1e-5)


def silu_backprop(dy, x):
    sigma = torch.sigmoid(x)
    return dy * sigma * (1 + x * (1 - sigma))


def zeropower_via_newtonschulz5(G):
    X = G.bfloat16()
    if G.size(1) > G.size(2):
        X = X.transpose(1, 2)
    X = X / (X.norm(dim=(1, 2), keepdim=True) + 1e-7)
    for a, b, c in [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
                    (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)]:
        A = X @ X.transpose(1, 2)
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(1) > G.size(2):
        X = X.transpose(1, 2)
    return X


def block_causal(w0, w1, w2, q, k, v, lr0, lr1, lr2, chunk_size, use_muon, momentum, prenorm,
                 update_w0_w2=True, weight_norm=True):
    """`block_causal_lact_swiglu` (post-norm) / `prenorm_block_causal_lact_swiglu`. q, k, v [b, l, d]."""
    w0_norm, w1_norm, w2_norm = (w.norm(dim=2, keepdim=True) for w in (w0, w1, w2))
    w0_main, w1_main, w2_main = w0, w1, w2
    if momentum is not None:
        dw0_m, dw1_m, dw2_m = torch.zeros_like(w0), torch.zeros_like(w1), torch.zeros_like(w2)
    q, v = q.transpose(1, 2), v.transpose(1, 2)
    output = torch.zeros_like(v)
    e_index = 0
    seq_len = k.shape[1]
    for i in range(0, seq_len - chunk_size, chunk_size):
        s_index, e_index = i, i + chunk_size
        ki, vi, qi = k[:, s_index:e_index, :], v[:, :, s_index:e_index], q[:, :, s_index:e_index]
        lr0i, lr1i, lr2i = lr0[:, s_index:e_index], lr1[:, s_index:e_index], lr2[:, s_index:e_index]
        h = torch.bmm(w2, qi)
        gate = F.silu(torch.bmm(w0, qi))
        output[:, :, s_index:e_index] = torch.bmm(w1, gate * h)
        gate_before_act = torch.bmm(w0, ki.transpose(1, 2))
        hidden_before_mul = torch.bmm(w2, ki.transpose(1, 2))
        hidden = F.silu(gate_before_act) * hidden_before_mul
        dhidden = torch.bmm(w1.transpose(1, 2), vi)
        dhidden_before_mul = dhidden * F.silu(gate_before_act)
        dgate = dhidden * hidden_before_mul
        dgate_before_act = silu_backprop(dgate, gate_before_act)
        dw1 = torch.bmm(vi, hidden.transpose(1, 2) * lr1i)
        dw0 = torch.bmm(dgate_before_act, ki * lr0i)
        dw2 = torch.bmm(dhidden_before_mul, ki * lr2i)
        if not update_w0_w2:
            dw0, dw2 = torch.zeros_like(dw0), torch.zeros_like(dw2)
        if momentum is not None:
            m_i = momentum[:, s_index:e_index, :].mean(dim=1, keepdim=True)
            dw0, dw1, dw2 = dw0 + dw0_m * m_i, dw1 + dw1_m * m_i, dw2 + dw2_m * m_i
            dw0_m, dw1_m, dw2_m = dw0, dw1, dw2
        if use_muon:
            dw1 = zeropower_via_newtonschulz5(dw1)
            if update_w0_w2:
                dw0, dw2 = zeropower_via_newtonschulz5(dw0), zeropower_via_newtonschulz5(dw2)
        if prenorm:
            w1_main, w0_main, w2_main = w1_main + dw1, w0_main + dw0, w2_main + dw2
            new = w0_main, w1_main, w2_main
        else:
            new = w0 + dw0, w1 + dw1, w2 + dw2
        if weight_norm:
            w0, w1, w2 = (w / (w.norm(dim=2, keepdim=True) + 1e-5) * n
                          for w, n in zip(new, (w0_norm, w1_norm, w2_norm)))
            if not update_w0_w2:  # the unchanged weights are not renormalised (they did not move)
                w0, w2 = new[0], new[2]
        else:
            w0, w1, w2 = new
    qi = q[:, :, e_index:seq_len]
    h = torch.bmm(w2, qi)
    gate = F.silu(torch.bmm(w0, qi))
    output[:, :, e_index:seq_len] = torch.bmm(w1, gate * h)
    return output.transpose(1, 2)


def low_rank(p, prefix):
    W = p[prefix + ".w_left"] @ p[prefix + ".w_right"]
    return W + torch.eye(W.shape[1], W.shape[2]).unsqueeze(0) * 0.5


def layer(c, p, x):
    """LaCTSWIGLULayer.forward for one whole sequence (no cache). x [b, s, C]."""
    b, s, C = x.shape
    Ha, da, nh = c.num_attn_heads, C // c.num_attn_heads, c.num_lact_heads
    qkv = x @ p["qkv.weight"].T + (p["qkv.bias"] if c.qkv_bias else 0)
    q, k, v = qkv.chunk(3, dim=-1)
    if c.attn_qk_norm:
        q, k = rms(q, p["q_norm.weight"], 1e-5), rms(k, p["k_norm.weight"], 1e-5)
    fast_q = q * p["qk_scale"][:, 0] + p["qk_offset"][:, 0]
    fast_k = k * p["qk_scale"][:, 1] + p["qk_offset"][:, 1]
    fast_v = v
    qh, kh, vh = (t.reshape(b, s, Ha, da) for t in (q, k, v))
    qh, kh = rope(qh, 0, c.rope_theta), rope(kh, 0, c.rope_theta)
    scores = torch.einsum("bqhd,bkhd->bhqk", qh, kh) / math.sqrt(da)
    i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
    band = (j <= i) & (j > i - c.window_size)  # flash-attn causal, window (window_size - 1, 0)
    scores = scores.masked_fill(~band, float("-inf"))
    o = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), vh).reshape(b, s, C)

    def heads(t):  # 'b s (n_h d) -> (b n_h) s d'
        return t.reshape(b, s, nh, C // nh).permute(0, 2, 1, 3).reshape(b * nh, s, C // nh)

    def merge(t):  # '(b n_h) s d -> b s (n_h d)'
        return t.reshape(b, nh, s, -1).permute(0, 2, 1, 3).reshape(b, s, -1)

    fast_q, fast_k, fast_v = heads(fast_q), heads(fast_k), heads(fast_v)
    if c.qkv_silu:
        fast_q, fast_k = F.silu(fast_q), F.silu(fast_k)
        if not c.no_v_silu:
            fast_v = F.silu(fast_v)
    fast_q, fast_k = l2_norm(fast_q), l2_norm(fast_k)
    if not c.ttt_nope:
        fast_q = rope(merge(fast_q).reshape(b, s, Ha, da), 0, c.rope_theta).reshape(b, s, C)
        fast_k = rope(merge(fast_k).reshape(b, s, Ha, da), 0, c.rope_theta).reshape(b, s, C)
        fast_q, fast_k = heads(fast_q), heads(fast_k)
    if c.w0_w2_low_rank > 0:
        w0, w2 = low_rank(p, "w0").repeat(b, 1, 1), low_rank(p, "w2").repeat(b, 1, 1)
    else:
        w0, w2 = p["w0"].repeat(b, 1, 1), p["w2"].repeat(b, 1, 1)
    w1 = p["w1"].repeat(b, 1, 1)
    base_lr_inv = 0.001 + math.log(-math.expm1(-0.001))
    lr = F.softplus((x @ p["lr_proj.weight"].T + p["lr_proj.bias"]).float() + base_lr_inv)
    fw_lr = lr.reshape(b, s, nh, -1).permute(0, 2, 1, 3).reshape(b * nh, s, -1)
    lr1, lr2, lr3 = fw_lr.chunk(3, dim=-1)
    momentum = None
    if c.use_momentum:
        momentum = torch.sigmoid(x @ p["momentum_proj.0.weight"].T + p["momentum_proj.0.bias"])
        momentum = momentum.reshape(b, s, nh, 1).permute(0, 2, 1, 3).reshape(b * nh, s, 1)
    fw_x = block_causal(w0, w1, w2, fast_q, fast_k, fast_v, lr1, lr2, lr3, c.lact_chunk_size, c.use_muon,
                        momentum, c.ttt_prenorm, c.lact_update_w0_w2, c.lact_weight_norm)
    ttt = rms(fw_x, p["ttt_norm.weight"], 1e-5)
    if c.learnable_ttt_scale:
        scale = F.silu(x @ p["ttt_scale_proj.weight"].T + p["ttt_scale_proj.bias"])
        ttt = ttt * scale.reshape(b, s, nh, 1).permute(0, 2, 1, 3).reshape(b * nh, s, 1)
    o = o + merge(ttt)
    return o @ p["o_proj.weight"].T


def forward(c, sd, ids):
    """LaCTForCausalLM.forward: logits [b, s, V] for ids [b, s]."""
    h = sd["model.embeddings.weight"][ids]
    for i in range(c.num_hidden_layers):
        pre = f"model.layers.{i}."
        p = {k[len(pre + "attn."):]: t for k, t in sd.items() if k.startswith(pre + "attn.")}
        h = h + layer(c, p, rms(h, sd[pre + "attn_norm.weight"], c.norm_eps))
        x = rms(h, sd[pre + "mlp_norm.weight"], c.norm_eps)
        gate, up = x @ sd[pre + "mlp.gate_proj.weight"].T, x @ sd[pre + "mlp.up_proj.weight"].T
        h = h + (F.silu(gate) * up) @ sd[pre + "mlp.down_proj.weight"].T
    h = rms(h, sd["model.norm.weight"], c.norm_eps)
    head = sd.get("lm_head.weight", sd["model.embeddings.weight"])
    return h @ head.T
