"""The step checker: ``python -m checker NN`` compares steps/step_NN.py with
solutions/solution_NN.py. See checker/harness.py for how a check runs."""

import os

# Run eager MAX work in the interpreter only. The default ("composite")
# executor also starts background compiles that compete for the cores; on a
# 2-core machine the interpreter alone made the checks 1.5-2x faster.
os.environ.setdefault("MAX_EAGER_EXECUTOR", "interpreter")
