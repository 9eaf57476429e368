"""Your code: one file per step. Fill in the TODOs, then check a step with
``pixi run sNN`` (or ``python3.13 tasks.py sNN`` without pixi)."""
