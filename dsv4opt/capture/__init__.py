"""How a trace is obtained: the embedded workload, a live SGLang server, or existing trace files."""
