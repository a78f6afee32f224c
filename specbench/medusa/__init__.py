"""The Medusa family: heads as an nn.Module and their checkpoints, self-distillation training, and
tree calibration. The runtime proposer that drafts with them is :mod:`specbench.proposers.medusa`."""
