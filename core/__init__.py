"""podhealth: fleet observability and health checks for NVIDIA DGX clusters."""

__version__ = "0.1.0"
