"""Gating: the stored baselines and their regeneration, the gates that compare a run with them
(with bootstrap intervals), and the results history kept beside the baselines."""
