"""The closed loop: apply/revert optimisations, re-profile, sweep concurrencies."""
