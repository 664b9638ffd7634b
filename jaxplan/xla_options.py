"""Compiler options for jaxplan's programs on XLA:CPU.

XLA:CPU's newer fusion emitters (its default) compile the sweep's chunk kernel, a `while_loop`
around many small fused operations, in about twice the time the older emitters take, while the
program they make streams about 8% faster. `LEAN_COMPILE` selects the older emitters: the chunk
kernel uses it for grids small enough that compilation dominates (`funnel.chunk.chunk_kernel`),
and so do the replay's one-shot programs (start, merge, summary). Their results are the same to
the bit (tests/test_xla_options.py). The report rows' kernel keeps the default: there the two
emitters round a few float32 results differently, and its numbers are the ones printed; so does
the replay's loop, which runs faster with it. The option is a CPU debug option: other backends
ignore it.
"""

from __future__ import annotations

LEAN_COMPILE = {"xla_cpu_use_fusion_emitters": False}
