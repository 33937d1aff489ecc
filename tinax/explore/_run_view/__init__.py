"""The run view: a run's table, drift, scan for non-finite values, retention and names."""
