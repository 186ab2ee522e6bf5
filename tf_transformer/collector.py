"""Python's garbage collector set for TensorFlow's many objects: fewer collections of the same heap.

CPython collects its youngest generation every 700 new container objects (``gc.get_threshold()``
is ``(700, 10, 10)``) and looks through the older ones every 7,000 and 70,000. Importing
TensorFlow and tracing a function make millions of objects that live as long as the process,
so most of those collections walk a large heap and free nothing. Measured on the AVX2-only EPYC
(2026-12-02, the time inside collections from ``gc.callbacks``): ``import tensorflow`` 0.8 s of
collections at the defaults, 0.3 s at :data:`THRESHOLDS`; the toy ``train.py`` run of the tests
2.1-2.7 s against 0.9-1.1 s; ``tests/test_beam_search.py`` in one process 4.2 against 2.3 s.

:func:`collect_less_often` raises the thresholds; :mod:`tf_transformer.cli` calls it, so every
command has it, and so do the test processes. Objects in reference cycles are still freed, by the
next collection of the generation they are in.
"""

import gc

# The youngest generation collected every 50,000 new container objects, the middle one every 20 of those
# collections, the oldest every 20 of the middle one's (and then only when a quarter of it is new: CPython's rule).
THRESHOLDS = (50_000, 20, 20)


def collect_less_often():
    """Raises each of the collector's three thresholds to :data:`THRESHOLDS`' (a higher one is kept) and
    returns them as set."""
    gc.set_threshold(*(max(now, least) for now, least in zip(gc.get_threshold(), THRESHOLDS)))
    return gc.get_threshold()
