"""The built-in policy losses, one module each (imported on first use by the registry)."""
