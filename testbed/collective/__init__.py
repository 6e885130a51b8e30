"""Network-aware collectives: a collective that reads the network (``traffic.collective.adapt``).

At the start of every operation (one iteration of a collective job) the hosts ask the run's collective helper
(decider.py, over workloads/collective_channel.py) how to send it; the helper reads the switches' counters
into a ``NetworkView`` (view.py) — the data a communication library would get from a telemetry service — and a
policy (policy.py; one module per policy) decides each of the operation's flows: its entropy, i.e. the queue
pair whose path carries it.
"""
