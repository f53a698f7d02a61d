"""Experiments over runs: hyper-parameter search (tune), model comparison over split seeds
(compare), training-curve pictures (plots) and TensorBoard logging (tblog). The CLI verbs are in
vaecf.cli.experiments."""
