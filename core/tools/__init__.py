"""Tools and the per-turn tool policy."""
