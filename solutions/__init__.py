"""Reference solutions: the single source of every step.

The learner skeletons in ``steps/`` are generated from these files by
``python -m checker.skeleton`` (regions between ``# BEGIN SOLUTION`` and
``# END SOLUTION`` become TODOs), so the two can never drift apart.
"""
