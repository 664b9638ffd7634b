"""Reports: terminal tables, JSON, and the ready-to-run `vllm serve` command."""
