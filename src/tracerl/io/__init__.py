"""tracerl.io: files, engines, environments and the rollout driver; never imports torch."""
