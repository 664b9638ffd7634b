"""Units: everything inside jaxplan is SI (seconds, bytes, FLOP/s, bytes/s).

Conversions live here and are used only when reading configs and printing.
"""

GIB_BYTES = 1024**3
GB_BYTES = 1e9
TB_PER_S_BYTES_PER_S = 1e12
GB_PER_S_BYTES_PER_S = 1e9
TFLOPS_FLOPS_PER_S = 1e12
MS_S = 1e-3
US_S = 1e-6
HOUR_S = 3600.0


def to_ms(seconds: float) -> float:
    return seconds / MS_S
