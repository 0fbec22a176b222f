"""TTT-Linear and TTT-MLP (ttt-lm-pytorch's `model_type` "ttt"; edgettt's converted forms of them, model type
"edgettt-linear-attention"), DESIGN sections 3 and 4.

    config.py          the config keys (ttt-lm-pytorch's and edgettt's), the published sizes (`PRESETS`)
    mixer.py           what the original and converted layers share: projections, rotary, post-norm, gate
    original.py        the original TTT layer: mini-batch gradient steps on the fast weights
    converted.py       the same layer as a linear attention (forms exact and parallel; the decayed parallel form)
    model.py           the language model around them (`CausalLM`)
    conversion.py      `convert`: the original's weights re-labelled as the linear attention's
    checkpoint.py      the size check of a checkpoint against its weights; the card of weights from elsewhere
    jax_checkpoint.py  ttt-lm-jax's streaming checkpoints read as this layout
    random_init.py     a random model of any size (`edgettt create`)
    kernels.py         the layers with their Triton kernels (`edgettt.prepare`; imported only there)
Its operations are in `edgettt.ops.linear_attention`.
"""

from edgettt.families.family import Creator, Family
from edgettt.families.ttt.checkpoint import check_sizes, source_card
from edgettt.families.ttt.config import CONVERTED_MODEL_TYPE, TTT_MODEL_TYPE, ModelConfig
from edgettt.families.ttt.conversion import convert
from edgettt.families.ttt.jax_checkpoint import find_checkpoint, load_jax_checkpoint
from edgettt.families.ttt.model import CausalLM
from edgettt.families.ttt.random_init import CREATE_DEFAULTS, KINDS, PRESET_VOCAB, PRESETS, new_config, random_model


def kernel_layers() -> dict:
    from edgettt.families.ttt.kernels import KERNEL_LAYERS  # (Triton: imported where a kernel runs, not to load)

    return KERNEL_LAYERS


def compiled_decode(model, token_kernel: bool) -> int:
    from edgettt.families.ttt.kernels import use_compiled_decode

    return use_compiled_decode(model, token_kernel)


FAMILY = Family(name="ttt", model_types=(TTT_MODEL_TYPE, CONVERTED_MODEL_TYPE), config_class=ModelConfig,
                model_class=CausalLM, check_sizes=check_sizes, convert=convert, kernel_layers=kernel_layers,
                compiled_decode=compiled_decode, foreign_checkpoint=find_checkpoint,
                load_foreign=load_jax_checkpoint, source_card=source_card,
                creator=Creator(kinds=KINDS, defaults={k: CREATE_DEFAULTS for k in KINDS},
                                presets={k: PRESETS for k in KINDS}, preset_vocab=PRESET_VOCAB, config=new_config,
                                random_model=random_model))
