"""From a profile to a decision: what the bottleneck is and which change to make next."""
