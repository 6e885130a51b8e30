"""One run lifecycle over two back ends: lifecycle.py runs a scenario the same way whether its fabric lives on
this machine (local.py) or is split over a Ray cluster's machines (testbed/cluster/run.py); backend.py says what
a back end provides. Nothing is imported here, so that a back end can import the interface without the
lifecycle's dependencies (the report's pandas)."""
