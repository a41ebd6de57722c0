"""Used by recipes/plan.py and the studies only, never by training: the analytic planner (shapes, memory, speed) and
the scaling-study arithmetic."""
