"""Serving many visitors on one CPU: the budget, the step gate, per-visitor sessions, the stack pool, memory."""
