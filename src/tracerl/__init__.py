"""tracerl: TRACE (Tree Rollout Allocation for Contrastive Exploration) for agentic RL."""

__version__ = "0.1.0"
