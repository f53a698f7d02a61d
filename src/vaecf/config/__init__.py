"""Settings: every setting declared once, and how a run's settings are read and written. Imports
no torch (the command line's --help and the data verbs stay light).

    settings.py      setting(): a setting declared once (type, default, help), the shared
                     ones (device, precision, model), and how a message spells a setting
    modelconfigs.py  every model's settings dataclass and the defaults they share
    specs.py         what each model is (its name, family, settings, where its class lives)
    train.py         TrainConfig: the training settings, resolved when a run starts
    serve.py         ServeSettings: the server's address, auth, limits, micro-batching
    toml.py          a run's settings as a TOML file (`vaecf train --config`)
"""

from __future__ import annotations

from vaecf.config.train import ModelConfig, TrainConfig

__all__ = ["ModelConfig", "TrainConfig"]
