"""Fast pure-Python simulators used where the real engine is too slow for a slider."""
