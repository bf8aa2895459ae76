"""Task domains: rows in verl layout, tool-using environments, scripted experts."""
