"""Model references and weights: resolve, load strictly, normalise configs."""
