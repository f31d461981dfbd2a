"""The pytest layer: one owner per job, below ``conformance.session`` (the hooks) and ``conformance.plugin``.

* ``setup``: pytest's config to the run's inputs, every refusal a ``UsageError``.
* ``context``: ``RunContext``, the run's shared state (the suites' ``conformance`` fixture).
* ``run_life``: the run's start (folder, nodes, GPU watch) and end (run.json, answer, exit status).
* ``planned``: each item's ``PlannedCase`` (ladder step, device set, decision), kept in ``item.stash``.
* ``cases``: ``CasePipeline``, an item to its record; ``strategy``: the ``CaseStrategy`` Protocol,
  with ``local`` (cases ``side_by_side``, collectives in a ``shared_group``) and ``across_nodes``.
* ``runner``: the forkserver and case runner's life; ``later_rungs``: rungs not needed, deselected.
* ``terminal``, ``junit``, ``host_checks``, ``progress``, ``failed_tests``: plugin objects and helpers.
* ``workers``, ``xdist_hooks``: xdist's two sides; ``pytest_private``: every reach into private internals.
"""
