"""What quantizing a model learns from sample text, above the quantizer (`edgettt.quant`):

    statistics.py  `edgettt calibrate`: each linear layer's input statistics (GPTQ's Hessians) and the
                   decode state's range along the text (the int8/int12 state's scales); `Calibration`,
                   its file, and its error feedback for the weight formats (`Calibration.feedback`)
    gptq.py        GPTQ's error feedback: each rounded column's error spread over the columns not yet rounded
    mixed.py       mixed precision by budget: each layer's format chosen for a size or KLD target
"""

from edgettt.calibration.mixed import Budget, MixedPlan, search_mix
from edgettt.calibration.statistics import Calibration, calibrate

__all__ = ["Calibration", "calibrate", "Budget", "MixedPlan", "search_mix"]
