"""Deployment files (prefect.yaml) and the launcher that runs them on a local server."""
