"""Write the flash-linear-attention fixtures: small DeltaNet and Gated DeltaNet checkpoints saved by fla itself,
with its models' logits, and its naive delta-rule references' outputs.

Each model fixture is one option set of fla 0.6's `GatedDeltaNetConfig` or `DeltaNetConfig` (short convolutions,
output gate and its activation, grouped value heads, expand_v/expand_k, allow_neg_eigval, DeltaNet's
qk_activation, qk_norm and use_beta, tied embeddings). fla builds the model, every parameter is perturbed (so
that a wrong transpose or a swapped name cannot go unnoticed), `save_pretrained` writes it, and its float32
logits on 80 fixed tokens go beside it in reference.safetensors. delta_rule.safetensors holds random
inputs of the gated delta rule and the outputs of fla's naive recurrent and chunk references
(`fla.ops.gated_delta_rule.naive`). `tests/test_deltanet.py` loads each with edgettt and compares.

fla's Triton kernels run on the CPU in Triton's interpreter; its autotuner times configs with a GPU's
benchmarker, so every config is given time 0 (each computes the same). Its chunk kernels do not run in the
interpreter, so the layers run their fused recurrent kernels (which fla takes for 64 tokens or fewer) at every
length: the same function, the chunked form being checked against fla's naive chunk reference instead. Run with fla 0.6.0
(`pip install flash-linear-attention==0.6.0 fla-core==0.6.0`, transformers 5.x, einops):

    TRITON_INTERPRET=1 python tests/fla_fixtures/make_fla_fixtures.py tests/fla_fixtures

It is not run by the tests (they need no fla); its outputs are committed.
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from triton.runtime import autotuner

autotuner.Autotuner._bench = lambda self, *args, config=None, **kwargs: [0.0, 0.0, 0.0]

from fla.models import DeltaNetConfig, DeltaNetForCausalLM, GatedDeltaNetConfig, GatedDeltaNetForCausalLM  # noqa: E402
from fla.ops.gated_delta_rule.naive import naive_chunk_gated_delta_rule, naive_recurrent_gated_delta_rule  # noqa: E402

VOCAB, TOKENS = 100, 80
SMALL = dict(hidden_size=64, num_hidden_layers=2, vocab_size=VOCAB, fuse_cross_entropy=False, intermediate_size=64)
FIXTURES = {
    "gdn": (GatedDeltaNetConfig, GatedDeltaNetForCausalLM, dict(head_dim=16, num_heads=2, intermediate_size=None)),
    "gdn-grouped-sigmoid-tied": (GatedDeltaNetConfig, GatedDeltaNetForCausalLM,
                                 dict(head_dim=16, num_heads=2, num_v_heads=4, output_gate_activation="sigmoid",
                                      tie_word_embeddings=True)),
    "gdn-noconv-nogate-negeig": (GatedDeltaNetConfig, GatedDeltaNetForCausalLM,
                                 dict(head_dim=16, num_heads=3, expand_v=1.0, use_short_conv=False, use_gate=False,
                                      allow_neg_eigval=True, fuse_norm=False, fuse_swiglu=False, conv_size=3)),
    "dn": (DeltaNetConfig, DeltaNetForCausalLM, dict(num_heads=4)),
    "dn-gate-relu-sum-negeig": (DeltaNetConfig, DeltaNetForCausalLM,
                                dict(num_heads=4, use_gate=True, qk_activation="relu", qk_norm="sum", expand_v=2.0,
                                     allow_neg_eigval=True)),
    "dn-elu-nobeta-noconv-tied": (DeltaNetConfig, DeltaNetForCausalLM,
                                  dict(num_heads=2, qk_activation="elu", use_beta=False, use_short_conv=False,
                                       expand_k=0.5, tie_word_embeddings=True)),
    "dn-identity-conv2": (DeltaNetConfig, DeltaNetForCausalLM, dict(num_heads=4, qk_activation="identity",
                                                                    conv_size=2)),
}


def perturbed(model: torch.nn.Module, gen: torch.Generator) -> torch.nn.Module:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("A_log", "dt_bias")):
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
            elif p.dim() == 1:  # norms
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.add_(0.02 * torch.randn(p.shape, generator=gen))
    return model


def write_model(out: Path, name: str, config_class, model_class, options: dict, seed: int) -> None:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = perturbed(model_class(config_class(**{**SMALL, **options})).float().eval(), gen)
    tokens = torch.randint(0, VOCAB, (1, TOKENS), generator=gen)
    for layer in model.model.layers:
        layer.attn.mode = "fused_recurrent"
    with torch.no_grad():
        logits = model(tokens).logits.float()
    model.save_pretrained(out / name)
    save_file({"tokens": tokens, "logits": logits.contiguous()},
              str(out / name / "reference.safetensors"))


def write_delta_rule(out: Path, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    B, T, H, K, V = 1, 100, 2, 16, 24
    q = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v, beta = torch.randn(B, T, H, V, generator=gen), torch.rand(B, T, H, generator=gen)
    g, state = -0.3 * torch.rand(B, T, H, generator=gen), torch.randn(B, H, K, V, generator=gen)
    o_rec, s_rec = naive_recurrent_gated_delta_rule(q, k, v, beta, g, initial_state=state, output_final_state=True)
    o_chunk, s_chunk = naive_chunk_gated_delta_rule(q, k, v, g, beta, initial_state=state, output_final_state=True)
    tensors = dict(q=q, k=k, v=v, beta=beta, g=g, initial_state=state, recurrent_o=o_rec, recurrent_state=s_rec,
                   chunk_o=o_chunk, chunk_state=s_chunk)
    save_file({n: t.contiguous() for n, t in tensors.items()}, str(out / "delta_rule.safetensors"))


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for seed, (name, spec) in enumerate(FIXTURES.items()):
        write_model(out, name, *spec, seed=seed)
        print("wrote", out / name)
    write_delta_rule(out)
    import fla
    (out / "fixtures.json").write_text(json.dumps({"fla": fla.__version__, "torch": torch.__version__,
                                                   "fixtures": sorted(FIXTURES)}, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
