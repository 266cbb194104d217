"""ldp-gatekeeper: a per-object privacy-budget gatekeeper for Local Differential Privacy."""
