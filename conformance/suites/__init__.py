"""The conformance suite: ``pytest --pyargs conformance.suites`` anywhere, ``pytest suites/`` in a checkout."""
