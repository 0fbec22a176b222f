"""The quantized weights' products: each kernel beside its plain-torch reference (`int4`, `int8`, `act8`);
the formats that call them are in `edgettt.quant.weight_formats`."""
