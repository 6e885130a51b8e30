"""Errors shared across the pipeline."""


class HelperFailed(Exception):
    """A process or thread the run depends on (the PFC agent, the telemetry sampler) died; the message is one
    line naming it and the cause. The run stops, keeps the results collected so far and says what failed."""
