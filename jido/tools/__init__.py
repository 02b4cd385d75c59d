"""Tools that drive the engine from outside."""
