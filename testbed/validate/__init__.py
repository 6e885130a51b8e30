"""``testbed validate``: the field's published results reproduced on real packets.

Each reference experiment is a scenario under ``scenarios/validation/`` whose ``reference:`` block (spec.py)
names its source, how it was normalised to the testbed's link rates, the published value, the tolerance and
why. suite.py runs each over seeds (a sweep), computes its metric (metrics.py) on every run the CPU guard
calls valid and gives a verdict; render.py draws the report page.
"""
