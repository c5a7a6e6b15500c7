"""uerl's own metrics (Prometheus, through Ray's metrics pipeline): what they are,
and who publishes which."""
