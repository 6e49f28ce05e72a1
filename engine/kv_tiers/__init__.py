"""The K/V tiers beyond the pool (issue 43): blocks evicted from the KV pool go to a bounded
RAM tier (ram_tier.py) and, written through, to a bounded disk directory (disk_tier.py,
block_file.py's format) that survives a restart; a request whose prefix is found there gets
its blocks filled from it instead of prefilled (tier_store.py). Keys are the block manager's
chained hashes under a namespace of model, tokenizer, dtypes, forward path and version
(keys.py; a LoRA adapter starts its own chain). config.py holds the knobs, moves.py the plain
data the scheduler hands over.
Nothing is imported here: the scheduling floor imports moves.py without torch.
"""
