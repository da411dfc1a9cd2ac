"""One exception root for isrwatch."""

__all__ = ["IsrwatchError", "ConfigError", "UnreachableError", "UnsupportedBrokerError"]


class IsrwatchError(Exception):
    """Anything isrwatch reports to the user as one clear line."""


class ConfigError(IsrwatchError):
    """A flag, environment variable or config file value is wrong."""


class UnreachableError(IsrwatchError):
    """A service isrwatch needs at start-up (Kafka, Alertmanager) cannot be reached."""


class UnsupportedBrokerError(IsrwatchError):
    """A broker speaks no version of a request that isrwatch sends (``isrwatch.kafkawire.request_version``)."""
