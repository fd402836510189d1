"""Reference implementations the tests hold production code to (never imported by podhealth)."""
