"""Small file helpers the stores share: atomic replacement, an exclusive lock, the JSON/JSON Lines reader and strict
JSON (non-finite floats as null)."""
