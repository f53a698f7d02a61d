"""The error family of vaecf: every user-facing failure says what to do instead."""


class VaecfError(ValueError):
    """Bad input or state the user can fix; the CLI maps it to exit code 2."""


class DataError(VaecfError):
    """An input file or prepared dataset is missing, malformed or too small."""


class RunError(VaecfError):
    """A run directory or checkpoint is missing, foreign or corrupted."""


class ConfigError(VaecfError):
    """A setting is out of range, misspelt, or does not apply to what was asked."""


class WriteError(VaecfError):
    """A write could not be completed (no space left); what was there before is intact."""


class BusyError(VaecfError):
    """Another live process is writing the same directory (its pid is in the message)."""


class UnknownUserError(VaecfError):
    """A user id that the run's prepared dataset does not hold (HTTP 404)."""


class TrainingDiverged(RuntimeError):
    """The loss stopped being finite: the run cannot go on as configured."""
