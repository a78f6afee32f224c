"""EAGLE-1/EAGLE-2 draft heads: the published checkpoint layout, the network and its drafting rules (docs/eagle.md)."""
