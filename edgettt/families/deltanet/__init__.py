"""DeltaNet and Gated DeltaNet (model types `delta_net`, `gated_deltanet`), in flash-linear-attention's layout:
linear attentions whose state learns by the delta rule, outside the TTT lineage (DESIGN 4.2).

    config.py              the config.json keys fla 0.6 saves, with its defaults and what edgettt refuses
    model.py               the model, with fla's module names
    conversion.py          `convert`: the model's own computation (it is a linear attention already)
    checkpoint.py          the size check of a checkpoint against its weights
    random_init.py         a random model of a small or a published size (`edgettt create`)
    kernels.py             the layer through fla's Triton kernels where fla is installed (`edgettt.prepare`)
Its operation (the delta rule: recurrence and chunked form) is in `edgettt.ops.delta_rule`.
"""

from edgettt.families.deltanet.checkpoint import check_deltanet_sizes
from edgettt.families.deltanet.config import DELTANET, GATED_DELTANET, DeltaRuleConfig
from edgettt.families.deltanet.conversion import convert, own_form
from edgettt.families.deltanet.model import DeltaRuleForCausalLM
from edgettt.families.deltanet.random_init import DEFAULTS, PRESET_VOCAB, PRESETS, new_config, random_model
from edgettt.families.family import Creator, Family


def kernel_layers() -> dict:
    from edgettt.families.deltanet.kernels import KERNEL_LAYERS  # (fla: imported where a kernel runs, not to load)

    return KERNEL_LAYERS


FAMILY = Family(name="deltanet", model_types=(GATED_DELTANET, DELTANET), config_class=DeltaRuleConfig,
                model_class=DeltaRuleForCausalLM, check_sizes=check_deltanet_sizes, convert=convert,
                kernel_layers=kernel_layers, form_converted_to=own_form,
                creator=Creator(kinds=tuple(DEFAULTS), defaults=DEFAULTS, presets=PRESETS, preset_vocab=PRESET_VOCAB,
                                config=new_config, random_model=random_model))
