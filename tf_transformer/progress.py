"""The training progress bar: steps done, ETA, and the latest loss, learning rate and tokens/s (and, with
another ``unit``, any count: the corpus builder's downloads).

A thin layer over ``tqdm``: the bar goes to standard error (tqdm's ETA from
its smoothed rate); log lines go through :meth:`Progress.write`, which clears
the bar, prints the line and redraws it, so the two never interleave.
"""

import sys

import tqdm


class Progress:
    """A bar of ``total_steps`` training steps, starting at ``initial_step`` when a run resumes.

    Args:
      total_steps: steps of the whole run (None when unknown: no ETA).
      initial_step: steps already done (a resumed run); the rate counts only new ones.
      disable: draw nothing (non-chief workers); :meth:`write` still prints. None: draw only on a terminal.
      file: where the bar goes (default standard error).
      log_file: where :meth:`write` prints (default standard output).
      unit: what the bar counts (default steps).
      desc: a label before the bar (default none).

    Example::

      with Progress(total_steps=1000, initial_step=step) as progress:
          for ...:
              progress.update(1, loss=loss, lr=lr, tokens_per_sec=rate)
              progress.write("epoch 1: ...")
    """

    def __init__(self, total_steps, initial_step=0, disable=False, file=None, log_file=None, unit="step", desc=None):
        self._log_file = log_file
        self._step = initial_step  # tqdm stops counting when disabled
        self._bar = tqdm.tqdm(total=total_steps, initial=initial_step, disable=disable,
                              file=file if file is not None else sys.stderr, unit=unit, desc=desc,
                              dynamic_ncols=True, smoothing=0.1)

    @property
    def n(self):
        """Steps counted so far, ``initial_step`` included."""
        return self._step

    def update(self, steps=1, loss=None, lr=None, tokens_per_sec=None):
        """Advances by ``steps`` and shows the given values after the bar (None: not shown)."""
        postfix = {}
        if loss is not None:
            postfix["loss"] = f"{float(loss):.4f}"
        if lr is not None:
            postfix["lr"] = f"{float(lr):.3g}"
        if tokens_per_sec is not None:
            postfix["tok/s"] = tqdm.tqdm.format_sizeof(float(tokens_per_sec))
        if postfix:
            self._bar.set_postfix(postfix, refresh=False)
        self._bar.update(steps)
        self._step += steps

    def set_total(self, total_steps):
        """The run's length became known (a learning-rate plan was fixed): the bar and its ETA use it."""
        self._bar.total = total_steps
        self._bar.refresh()

    def write(self, line):
        """Prints ``line`` without breaking the bar (to ``log_file``, default standard output)."""
        tqdm.tqdm.write(line, file=self._log_file if self._log_file is not None else sys.stdout)

    def close(self, leave=True):
        """Stops the bar; ``leave=False`` clears it from the terminal (a second close does nothing)."""
        self._bar.leave = leave and self._bar.leave
        self._bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
