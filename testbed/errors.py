"""The one error base of the project, and errors shared across the pipeline.

Every error a user may see derives from ``TestbedError``: its message is one readable line (what, and where),
so the CLI prints it and exits non-zero without a traceback.
"""


class TestbedError(Exception):
    """A problem phrased for the user: one line, what went wrong and where."""
    __test__ = False          # not a pytest test class, despite the name


class HelperFailed(TestbedError):
    """A process or thread the run depends on (the PFC agent, the telemetry sampler) died; the message is one
    line naming it and the cause. The run stops, keeps the results collected so far and says what failed."""


class DatapathError(TestbedError):
    """The eBPF datapath cannot be built or loaded here; the message is one readable line."""
