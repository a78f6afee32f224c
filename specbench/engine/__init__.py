"""The bundled speculative engine: targets, tree buffers, verification rules and the decode loop."""
