"""Training: from a prepared dataset and settings to a run directory, for every model.

entry.py       train(): `vaecf.train`, the one entry point (`--model auto` or one model)
auto.py        `--model auto`: the candidates fitted, blended, the best kept on validation
single.py      one model into a run directory: settings resolved, a resume checked, the fit
update.py      `vaecf update`: a run kept current with newer data, as a new run
gradient.py    GradientFit: the gradient models' epochs, early stopping, the budget, selection
run.py         Run: what every fit shares (device, validation, the test, results.json), the
               closed-form fit, and the budget's one deadline
resume.py      stopping a gradient run and resuming it (last.pt, the random state)
footprint.py   what a gradient model's training will hold, checked before it starts
background.py  checkpoint writes off the training loop
graphs.py      a run's training steps as CUDA graphs
"""

from __future__ import annotations

from vaecf.training.entry import train

__all__ = ["train"]
