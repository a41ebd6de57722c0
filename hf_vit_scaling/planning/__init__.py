"""Only recipes/plan.py and the studies use these: the analytic planner (shapes, memory, speed) and the scaling-study arithmetic."""
