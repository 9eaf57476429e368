"""The step checker: ``python -m checker NN`` compares steps/step_NN.py with
solutions/solution_NN.py. See checker/harness.py for how a check runs."""
