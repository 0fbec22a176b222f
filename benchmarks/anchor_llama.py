"""The anchor users would pick instead of a TTT model: a transformer of the same size (Llama
architecture, random weights), exported for ONNX Runtime by its own tooling (onnxruntime-genai's
model builder), so that `edgettt bench` can time it beside edgettt's exports.

    python benchmarks/anchor_llama.py --preset 125m --out anchors/ --precision fp32,int4
    python benchmarks/anchor_llama.py --preset tiny --out anchors/ --precision int4 --max-positions 8448

For the preset's sizes (`edgettt.families.ttt.config.PRESETS`: hidden, layers, heads, intermediate; vocabulary
32000; tied embeddings, as `edgettt create --preset` makes them) it writes a Hugging Face Llama with
random weights (`tiny`: the shipped tiny models' size, hidden 256, 5 layers, 4 heads, MLP 512, bytes as tokens:
3.3M parameters to ttt-linear-tiny's 3.4M; `edgettt compare`'s Llama) (`anchors/llama-125m-hf/`, a word-level tokenizer of the same vocabulary: the builder
copies one, the benchmark feeds token ids) and runs the builder for each precision on the CPU
(`anchors/llama-125m-fp32/`, `anchors/llama-125m-int4/`): int4 with the builder's CPU defaults (RTN,
symmetric, block 32, accuracy level 4: int8 activations) and `shared_embeddings` (the tied table
stored once, gathered with GatherBlockQuantized), the same choices as edgettt's int4 g32 export.
Speed does not depend on the weights' values.

Needs onnxruntime-genai, transformers and torch (`pip install onnxruntime-genai transformers`); run
it where they are installed. Outputs are refused if they exist (nothing is overwritten).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from edgettt.families.ttt.config import PRESET_VOCAB, PRESETS  # noqa: E402

SIZES = {**{name: (sizes, PRESET_VOCAB) for name, sizes in PRESETS.items()},
         "tiny": ({"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 5, "num_attention_heads": 4}, 256)}


def write_hf_llama(preset: str, out: Path, max_positions: int) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    sizes, vocab_size = SIZES[preset]
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=sizes["hidden_size"],
                         intermediate_size=sizes["intermediate_size"], num_hidden_layers=sizes["num_hidden_layers"],
                         num_attention_heads=sizes["num_attention_heads"],
                         num_key_value_heads=sizes["num_attention_heads"], max_position_embeddings=max_positions,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, torch_dtype="float32")
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(out, safe_serialization=True)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>").save_pretrained(out)
    print(f"wrote {out}: Llama {preset}, {sum(p.numel() for p in model.parameters()):,} parameters (tied), random")


def build(hf: Path, out: Path, precision: str) -> None:
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out), "-p", precision,
           "-e", "cpu", "-c", str(out.parent / ".builder-cache"), "--extra_options", "shared_embeddings=true"]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="125m", choices=sorted(SIZES))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--precision", default="fp32,int4", help="comma-separated: fp32, int4, int8 (builder's names)")
    ap.add_argument("--max-positions", type=int, default=8192, help="the context the KV cache may reach")
    args = ap.parse_args()
    hf = args.out / f"llama-{args.preset}-hf"
    targets = [args.out / f"llama-{args.preset}-{p}" for p in args.precision.split(",")]
    existing = [p for p in [hf, *targets] if p.exists()]
    if existing:
        sys.exit(f"{existing[0]}: exists; choose another --out (nothing is overwritten)")
    write_hf_llama(args.preset, hf, args.max_positions)
    for target, precision in zip(targets, args.precision.split(",")):
        build(hf, target, precision)


if __name__ == "__main__":
    main()
