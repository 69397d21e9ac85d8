"""One exception family for user-facing problems; the CLI maps it to exit code 2."""


class KvsimError(Exception):
    """A problem the user can fix (bad flag, bad file, a model that does not fit)."""


class ConfigError(KvsimError):
    """An invalid GPU, model or engine configuration."""


class DoesNotFitError(ConfigError):
    """Model weights (or one request) do not fit the GPU memory that was given."""


class ProfileError(KvsimError):
    """A missing, malformed or mismatched latency profile."""


class WorkloadError(KvsimError):
    """A malformed workload file, trace or distribution."""


class StalledError(KvsimError):
    """The deployment as configured can make no more progress (a deadlock the modelled scheduler
    has too, e.g. a decode cache filled by KV it is loading); more KV cache, or fewer instances
    feeding one, fixes it."""
