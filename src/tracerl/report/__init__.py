"""Reports over finished runs: `compare` (methods side by side, Markdown and PNG)."""
