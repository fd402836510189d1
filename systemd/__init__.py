"""Package marker: the unit files ship inside the wheel (podhealth install-units reads them)."""
