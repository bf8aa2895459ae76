"""A task written the way a verl user writes one: a BaseTool class, its tool config YAML and a reward file."""
