"""The shared record contracts, settings and errors: the project's lowest layer (it imports nothing else of
the project)."""

#: The project's distribution name on PyPI (``pip install kappa-fraud``): its version, its extras.
DISTRIBUTION = "kappa-fraud"
