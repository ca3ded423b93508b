"""Plans: the frozen Plan and its specs, schedules, plan files, checks, text and code export."""
