"""The solvers: DP, MILP, incumbent, baselines, the search and planning."""
