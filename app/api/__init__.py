"""HTTP routes, thin per protocol: they translate requests and responses, the data plane does the work."""
