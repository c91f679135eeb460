"""The embedded DeepSeek-V4-Flash-shaped decode workload."""
