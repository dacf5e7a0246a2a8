"""`rlkit algos check`: every registered estimator, loss, KL estimator and aggregation mode against small
batches worked out by hand (cases.py, loss_cases.py), and against verl's functions where verl is installed
(reference.py). docs/algorithms.md, "Checking the math", says how to run it and what it compares.
"""
