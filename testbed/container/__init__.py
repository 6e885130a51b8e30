"""Docker containers as hosts (``hosts.docker``): the engine (SDK client, installed and started on first use),
the local host image (``testbed image build``) and the containers of a lab (hosts.py)."""
