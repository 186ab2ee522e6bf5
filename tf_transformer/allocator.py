"""TensorFlow's CPU memory kept for reuse: its BFC allocator instead of a malloc and a free per tensor.

TensorFlow's default CPU allocator takes every tensor from ``malloc``. glibc
serves a buffer over 32 MiB (its largest mmap threshold) by a fresh ``mmap`` and
gives it back to the system when it is freed, so the same-sized buffer of the
next training step is new memory again, which the kernel zeroes page by page as
it is first written. A step's logits and their gradient are (target tokens,
vocabulary) floats: 61 MB each at 3,800 tokens and a vocabulary of 4,000, about
65,000 page faults a step (``resource.getrusage().ru_minflt``), and the step's
largest kernels (the output layer's matmuls, the loss) run at a fraction of
their speed on that memory.

TensorFlow's BFC allocator (``TF_CPU_ALLOCATOR_USE_BFC=true``; the kind it uses for a
GPU's memory, here for the CPU's) takes regions from the system as the process grows and reuses
them: no page faults after the first steps. It never gives memory back, so a
process stays at its largest size, which a training or translating process
reaches in its first steps anyway.

:func:`reuse_cpu_memory` turns it on for the process; :mod:`tf_transformer.cli` calls it,
so every command has it. ``TF_CPU_ALLOCATOR_USE_BFC=false`` in the environment keeps
``malloc``. It must run before TensorFlow makes its first tensor.

Where TensorFlow turns oneDNN on (by default on CPUs with AVX-512 VNNI or bfloat16 instructions; its start-up
notice says "oneDNN custom operations are on"), its CPU allocator is oneDNN's, which keeps large buffers
for reuse whatever the variable says; ``false`` means ``malloc`` only with oneDNN off
(``TF_ENABLE_ONEDNN_OPTS=0``).
"""

import os

USE_BFC = "TF_CPU_ALLOCATOR_USE_BFC"


def reuse_cpu_memory():
    """TensorFlow's CPU tensors from its BFC allocator (:data:`USE_BFC` ``"true"``), unless the environment
    already says (any value: ``"false"`` keeps ``malloc``). Returns the value that holds."""
    return os.environ.setdefault(USE_BFC, "true")


def allocator_setting():
    """``"TF_CPU_ALLOCATOR_USE_BFC=<value>"`` as the environment has it (``<unset>``: ``malloc``), for reports."""
    return f"{USE_BFC}={os.environ.get(USE_BFC, '<unset>')}"
