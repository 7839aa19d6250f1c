"""Serving many visitors on one CPU: the budget, the step gate, per-visitor state, the stack pool, memory."""
