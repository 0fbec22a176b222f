"""The number formats, the floor every other part stands on: it imports nothing of edgettt (torch only).

    layouts.py        int8, int4 and int6 codes and their bytes, and back (the weight formats store these;
                      the kernels' references dequantize with them)
    state_formats.py  the decode state's formats (fp32, fp16, int12, int12-kv8, int8, int8-tensor): their
                      formulas, bytes and codes across an exported graph's boundary
"""
